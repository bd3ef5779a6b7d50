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

static void test_every_page_of_a_span_maps_to_it(void) {
    kp_span *s = _kp_pageheap_alloc(7, KP_SPAN_LARGE);
    CHECK(s != NULL);
    for (size_t i = 0; i < 7; i++) CHECK(_kp_pagemap_get(s->start + i) == s);
    char *base = (char *)(s->start << KP_PAGE_SHIFT);
    CHECK(_kp_span_of(base) == s);
    CHECK(_kp_span_of(base + 7 * KP_PAGE_SIZE - 1) == s);
    CHECK(_kp_span_of(base + 7 * KP_PAGE_SIZE) != s);
    _kp_pageheap_free(s);
    CHECK(_kp_span_of(base) == NULL);           /* free spans are not "in use" */
    CHECK(_kp_span_of(base + 3 * KP_PAGE_SIZE) == NULL);
}

static void test_class_bytes_follow_small_spans(void) {
    void *p = kp_malloc(100);
    unsigned c = _kp_pagemap_class(p);
    CHECK(c == _kp_size_class(100));
    kp_free(p);
    void *big = kp_malloc(1 << 20);
    CHECK(_kp_pagemap_class(big) == 0);
    CHECK(_kp_span_of(big) != NULL && _kp_span_of(big)->state == KP_SPAN_LARGE);
    kp_free(big);
}

/* The flat map and the radix tree agree on every class byte; the flat map
 * exists unless the test is told it must not (the Makefile runs this test
 * again under a small address-space limit, where the reservation fails). */
static void test_flat_class_map_mirrors_the_tree(void) {
    const char *none = getenv("KP_EXPECT_NO_CLASSMAP");
    size_t pages = atomic_load(&_kp_classmap.pages);
    CHECK(none && *none == '1' ? pages == 0 : pages == ((size_t)1 << KP_CLASSMAP_BITS));
    void *small[KP_NUM_CLASSES];
    for (unsigned c = 1; c < KP_NUM_CLASSES; c++) {
        small[c] = kp_malloc(_kp_classes[c].size);
        CHECK(small[c] != NULL);
        CHECK(_kp_pagemap_class(small[c]) == c && _kp_pagemap_class_radix(small[c]) == c);
        CHECK(_kp_pagemap_class_flat(small[c]) == (pages ? c : 0));
    }
    void *big = kp_malloc(1 << 20);
    CHECK(_kp_pagemap_class_flat(big) == 0 && _kp_pagemap_class_radix(big) == 0);
    int local;
    CHECK(_kp_pagemap_class_flat(&local) == 0 && _kp_pagemap_class(NULL) == 0);
    CHECK(_kp_pagemap_class_flat((void *)((uintptr_t)1 << 47)) == 0);   /* above the flat map */
    for (unsigned c = 1; c < KP_NUM_CLASSES; c++) kp_free(small[c]);
    kp_free(big);
}

static void test_ensure_rejects_addresses_beyond_the_map(void) {
    CHECK(_kp_pagemap_ensure(((uintptr_t)1 << KP_PAGEMAP_BITS) - 1, 2) == -1);
}

int main(void) {
    _kp_init();
    RUN(test_lookup_of_unmapped_pages_is_null);
    RUN(test_every_page_of_a_span_maps_to_it);
    RUN(test_class_bytes_follow_small_spans);
    RUN(test_flat_class_map_mirrors_the_tree);
    RUN(test_ensure_rejects_addresses_beyond_the_map);
    return DONE();
}
