/* test_pageheap.c: span carving, splitting, coalescing, aligned spans, and
 * giving pages back to the OS. */
#include "check.h"
#include "kp_internal.h"

#include <sys/mman.h>
#include <sys/resource.h>

static void test_split_and_coalesce(void) {
    kp_span *a = _kp_pageheap_alloc(3, KP_SPAN_LARGE);
    kp_span *b = _kp_pageheap_alloc(5, KP_SPAN_LARGE);
    kp_span *c = _kp_pageheap_alloc(2, KP_SPAN_LARGE);
    CHECK(a && b && c);
    CHECK(_kp_pageheap_is_valid());
    int adjacent = b->start == a->start + 3 && c->start == b->start + 5;
    uintptr_t a_start = a->start;
    _kp_pageheap_free(a);
    _kp_pageheap_free(c);
    CHECK(_kp_pageheap_is_valid());
    _kp_pageheap_free(b);     /* merges with both neighbours */
    CHECK(_kp_pageheap_is_valid());
    if (adjacent) {
        kp_span *whole = _kp_pagemap_get(a_start);
        CHECK(whole && whole->state == KP_SPAN_FREE && whole->start == a_start && whole->npages >= 10);
    }
    kp_span *again = _kp_pageheap_alloc(10, KP_SPAN_LARGE);   /* fits in the merged span */
    CHECK(again != NULL);
    if (adjacent) CHECK_EQ(again->start, a_start);
    _kp_pageheap_free(again);
    CHECK(_kp_pageheap_is_valid());
}

static void test_aligned_spans(void) {
    for (size_t align_pages = 2; align_pages <= 256; align_pages *= 4) {
        kp_span *s = _kp_pageheap_alloc_aligned(3, align_pages, KP_SPAN_LARGE);
        CHECK(s != NULL);
        CHECK(s->start % align_pages == 0);
        CHECK_EQ(s->npages, 3);
        CHECK(_kp_pageheap_is_valid());
        _kp_pageheap_free(s);
    }
    CHECK(_kp_pageheap_is_valid());
}

static void test_trim_releases_free_spans(void) {
    kp_span *s = _kp_pageheap_alloc(64, KP_SPAN_LARGE);
    CHECK(s != NULL);
    memset((void *)(s->start << KP_PAGE_SHIFT), 7, 64 * KP_PAGE_SIZE);
    _kp_pageheap_free(s);
    kp_pageheap_figures before, after;
    _kp_pageheap_figures(&before);
    CHECK(before.free_bytes >= 64 * KP_PAGE_SIZE);
    size_t released = _kp_pageheap_trim();
    _kp_pageheap_figures(&after);
    CHECK(released >= 64 * KP_PAGE_SIZE);
    CHECK_EQ(after.free_bytes, 0);
    CHECK(after.released >= before.released + 64 * KP_PAGE_SIZE);
    CHECK(_kp_pageheap_is_valid());
    /* released pages come back zeroed */
    kp_span *t = _kp_pageheap_alloc(64, KP_SPAN_LARGE);
    CHECK(t != NULL);
    CHECK(((unsigned char *)(t->start << KP_PAGE_SHIFT))[100] == 0);
    _kp_pageheap_free(t);
}

static void test_map_failure_is_enomem_and_recoverable(void) {
    _kp_os_fail_next(1000);
    errno = 0;
    kp_span *s = _kp_pageheap_alloc((size_t)1 << 17, KP_SPAN_LARGE);   /* 1 GiB: needs a fresh map */
    CHECK(s == NULL);
    CHECK_EQ(errno, ENOMEM);
    _kp_os_fail_next(0);
    s = _kp_pageheap_alloc(4, KP_SPAN_LARGE);
    CHECK(s != NULL);
    if (s) _kp_pageheap_free(s);
    CHECK(_kp_pageheap_alloc(((size_t)1 << KP_PAGEMAP_BITS), KP_SPAN_LARGE) == NULL);
    CHECK(_kp_pageheap_is_valid());
}

static void test_many_spans_random_order(void) {
    enum { N = 500 };
    kp_span *s[N];
    unsigned seed = 12345;
    for (int i = 0; i < N; i++) {
        seed = seed * 1103515245u + 12345u;
        s[i] = _kp_pageheap_alloc(1 + (seed >> 16) % 40, KP_SPAN_LARGE);
        CHECK(s[i] != NULL);
    }
    for (int i = 0; i < N; i++) {
        seed = seed * 1103515245u + 12345u;
        int j = (int)((seed >> 16) % N);
        kp_span *t = s[i]; s[i] = s[j]; s[j] = t;
    }
    for (int i = 0; i < N; i++) {
        _kp_pageheap_free(s[i]);
        if (i % 50 == 0) CHECK(_kp_pageheap_is_valid());
    }
    CHECK(_kp_pageheap_is_valid());
}

/* Free pages are kept resident up to a quarter of the bytes in use (at least
 * KP_RETAIN_MIN): a big heap that frees a part keeps it for the next
 * allocations instead of faulting them in again; once the heap is small the
 * free pages go back down to the minimum. */
static void test_retention_scales_with_heap(void) {
    enum { N = 64, PAGES = 256 };    /* 64 spans of 2 MiB: 128 MiB in use */
    _kp_pageheap_trim();
    kp_span *s[N];
    for (int i = 0; i < N; i++) {
        s[i] = _kp_pageheap_alloc(PAGES, KP_SPAN_LARGE);
        CHECK(s[i] != NULL);
    }
    kp_pageheap_figures before, mid, after;
    _kp_pageheap_figures(&before);
    for (int i = 0; i < 12; i++) _kp_pageheap_free(s[i]);   /* 24 MiB free, 104 MiB in use */
    _kp_pageheap_figures(&mid);
    CHECK_EQ(mid.released, before.released);
    CHECK(mid.free_bytes >= (size_t)12 * PAGES * KP_PAGE_SIZE);
    CHECK((size_t)12 * PAGES * KP_PAGE_SIZE > ((size_t)16 << 20));   /* more than a fixed 16 MiB would keep */
    for (int i = 12; i < N; i++) _kp_pageheap_free(s[i]);
    _kp_pageheap_figures(&after);
    CHECK(after.free_bytes <= KP_RETAIN_MIN);
    CHECK(after.released >= before.released + (size_t)(N * PAGES) * KP_PAGE_SIZE - KP_RETAIN_MIN);
    CHECK(_kp_pageheap_is_valid());
}

static long minor_faults(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt;
}

/* A range made of two kernel mappings (the second moved beside the first
 * with mremap keeps its own) moves page for page: its contents arrive, no
 * page is copied (a copy would fault every page of the target in), and the
 * old range is gone. */
static void test_move_across_mappings(void) {
    size_t ps = _kp_os_page_size(), half = 64 * ps;
    char *a = mmap(NULL, 2 * half, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *b = mmap(NULL, half, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(a != MAP_FAILED && b != MAP_FAILED);
    memset(a, 'a', half);
    memset(b, 'b', half);
    CHECK(mremap(b, half, half, MREMAP_MAYMOVE | MREMAP_FIXED, a + half) == a + half);
    CHECK(mremap(a, 2 * half, 2 * half + ps, 0) == MAP_FAILED && errno == EFAULT);   /* two mappings */
    char *dst = _kp_os_map(4 * half, ps);
    CHECK(dst != NULL);
    long before = minor_faults();
    CHECK_EQ(_kp_os_move(a, 2 * half, 4 * half, dst), 0);
    long faults = minor_faults() - before;
    CHECK(faults < 16);
    CHECK(dst[0] == 'a' && dst[half - 1] == 'a' && dst[half] == 'b' && dst[2 * half - 1] == 'b');
    CHECK(dst[2 * half] == 0 && dst[4 * half - 1] == 0);            /* the grown tail reads as zero */
    CHECK(msync(a, ps, MS_ASYNC) != 0 && errno == ENOMEM);          /* the old range is unmapped */
    CHECK(msync(a + half, ps, MS_ASYNC) != 0 && errno == ENOMEM);
    _kp_os_unmap(dst, 4 * half);
}

int main(void) {
    _kp_init();
    RUN(test_split_and_coalesce);
    RUN(test_aligned_spans);
    RUN(test_trim_releases_free_spans);
    RUN(test_map_failure_is_enomem_and_recoverable);
    RUN(test_many_spans_random_order);
    RUN(test_retention_scales_with_heap);
    RUN(test_move_across_mappings);
    return DONE();
}
