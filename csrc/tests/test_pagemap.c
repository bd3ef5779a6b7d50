/* test_pagemap.c: page -> span lookups, class bytes, validation of stale
 * and foreign pointers. */
#include <stdlib.h>

#include "check.h"
#include "kp_internal.h"

static void test_lookup_of_unmapped_pages_is_null(void) {
    int local;
    CHECK(_kp_pagemap_get((uintptr_t)&local >> KP_PAGE_SHIFT) == NULL);
    CHECK(_kp_pagemap_get(((uintptr_t)1 << KP_PAGEMAP_BITS) + 5) == NULL);   /* beyond 48 bits */
    CHECK(_kp_pagemap_class((void *)~(uintptr_t)0) == 0);
    CHECK(_kp_span_of(&local) == NULL);
}

static void test_pages_of_spans_map_to_them(void) {
    /* a pool chunk: every page (blocks find their chunk by page) */
    kp_span *s = _kp_pageheap_alloc(7, KP_SPAN_POOL);
    CHECK(s != NULL);
    for (size_t i = 0; i < 7; i++) CHECK(_kp_pagemap_get(s->start + i) == s);
    char *base = (char *)(s->start << KP_PAGE_SHIFT);
    CHECK(_kp_span_of(base) == s);
    CHECK(_kp_span_of(base + 7 * KP_PAGE_SIZE - 1) == s);
    CHECK(_kp_span_of(base + 7 * KP_PAGE_SIZE) != s);
    _kp_pageheap_free(s);
    CHECK(_kp_span_of(base) == NULL);           /* free spans are not "in use" */
    CHECK(_kp_span_of(base + 3 * KP_PAGE_SIZE) == NULL);
    /* a large span: its ends, and a class byte on every page */
    kp_span *l = _kp_pageheap_alloc(9, KP_SPAN_LARGE);
    CHECK(l != NULL);
    char *lb = (char *)(l->start << KP_PAGE_SHIFT);
    CHECK(_kp_pagemap_get(l->start) == l && _kp_pagemap_get(l->start + 8) == l);
    for (size_t i = 0; i < 9; i++) CHECK_EQ(_kp_pagemap_class(lb + i * KP_PAGE_SIZE), KP_CLASS_LARGE);
    CHECK(_kp_pagemap_class(lb + 9 * KP_PAGE_SIZE) != KP_CLASS_LARGE || _kp_pagemap_get(l->start + 9) != l);
    _kp_pageheap_free(l);
    for (size_t i = 0; i < 9; i++) CHECK_EQ(_kp_pagemap_class(lb + i * KP_PAGE_SIZE), 0);
    kp_span *a = _kp_pageheap_alloc(3, KP_SPAN_ARENA);
    CHECK(a != NULL);
    CHECK_EQ(_kp_pagemap_class((char *)(a->start << KP_PAGE_SHIFT) + 2 * KP_PAGE_SIZE), KP_CLASS_ARENA);
    _kp_pageheap_free(a);
}

static void test_class_bytes_follow_small_spans(void) {
    void *p = kp_malloc(100);
    unsigned c = _kp_pagemap_class(p);
    CHECK(c == _kp_size_class(100));
    kp_free(p);
    void *big = kp_malloc(1 << 20);
    CHECK_EQ(_kp_pagemap_class(big), KP_CLASS_LARGE);
    CHECK(_kp_span_of(big) != NULL && _kp_span_of(big)->state == KP_SPAN_LARGE);
    kp_free(big);
}

/* A page's class byte is in the window if the page is, else in its leaf;
 * _kp_pagemap_class answers from either. The Makefile runs this test again
 * with KPOOL_CLASSMAP_PAGES=0 (no window) and with a tiny window (most
 * pages outside it). */
static void test_class_bytes_live_in_the_window_or_the_leaf(void) {
    const char *env = getenv("KPOOL_CLASSMAP_PAGES");
    size_t want = env && *env ? (size_t)strtoull(env, NULL, 0) : KP_CLASSMAP_PAGES;
    size_t pages = atomic_load(&_kp_classmap.pages);
    CHECK_EQ(pages, want);
    uintptr_t base = atomic_load(&_kp_classmap.base);
    void *small[KP_NUM_CLASSES];
    for (unsigned c = 1; c < KP_NUM_CLASSES; c++) {
        small[c] = kp_malloc(_kp_classes[c].size);
        CHECK(small[c] != NULL);
        int inside = ((uintptr_t)small[c] >> KP_PAGE_SHIFT) - base < pages;
        CHECK_EQ(_kp_pagemap_class(small[c]), c);
        CHECK_EQ(_kp_pagemap_class_flat(small[c]), inside ? c : 0);
        CHECK_EQ(_kp_pagemap_class_radix(small[c]), inside ? 0 : c);
    }
    void *big = kp_malloc(1 << 20);
    CHECK_EQ(_kp_pagemap_class(big), KP_CLASS_LARGE);
    int local;
    CHECK(_kp_pagemap_class_flat(&local) == 0 && _kp_pagemap_class(NULL) == 0);
    CHECK(_kp_pagemap_class((void *)((uintptr_t)1 << 47)) == 0);   /* above user space */
    /* With the default window, kpool's own mappings land in it (the
     * one-load path); a process that sets a window of its own may not. */
    if (!env || !*env) {
        CHECK(((uintptr_t)small[1] >> KP_PAGE_SHIFT) - base < pages);
        CHECK(((uintptr_t)big >> KP_PAGE_SHIFT) - base < pages);
    }
    for (unsigned c = 1; c < KP_NUM_CLASSES; c++) kp_free(small[c]);
    kp_free(big);
}

static void test_ensure_rejects_addresses_beyond_the_map(void) {
    CHECK(_kp_pagemap_ensure(((uintptr_t)1 << KP_PAGEMAP_BITS) - 1, 2) == -1);
}

int main(void) {
    _kp_init();
    RUN(test_lookup_of_unmapped_pages_is_null);
    RUN(test_pages_of_spans_map_to_them);
    RUN(test_class_bytes_follow_small_spans);
    RUN(test_class_bytes_live_in_the_window_or_the_leaf);
    RUN(test_ensure_rejects_addresses_beyond_the_map);
    return DONE();
}
