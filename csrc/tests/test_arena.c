/* test_arena.c: bump allocation, alignment, oversized requests, reset
 * keeping the first chunk, destroy. */
#include "check.h"
#include "kp_internal.h"

#include <errno.h>
#include <string.h>

static void test_bump_and_alignment(void) {
    kp_arena *a = kp_arena_create(0);
    CHECK(a != NULL);
    CHECK_EQ(kp_arena_used(a), 0);
    char *prev = NULL;
    for (size_t align = 1; align <= ((size_t)1 << 16); align *= 2) {
        char *p = kp_arena_alloc(a, 24, align);
        CHECK(p && (uintptr_t)p % align == 0);
        CHECK(kp_owns(p));
        if (prev) CHECK(p != prev);
        memset(p, 1, 24);
        prev = p;
    }
    errno = 0;
    CHECK(kp_arena_alloc(a, 10, 3) == NULL);
    CHECK_EQ(errno, EINVAL);
    errno = 0;
    CHECK(kp_arena_alloc(a, SIZE_MAX, 16) == NULL);
    CHECK_EQ(errno, ENOMEM);
    void *z1 = kp_arena_alloc(a, 0, 0), *z2 = kp_arena_alloc(a, 0, 0);
    CHECK(z1 && z2 && z1 != z2);
    kp_arena_destroy(a);
}

static void test_big_requests_get_their_own_chunk(void) {
    kp_arena *a = kp_arena_create(64 << 10);
    char *small = kp_arena_alloc(a, 100, 16);
    char *big = kp_arena_alloc(a, 1 << 20, 16);
    char *small2 = kp_arena_alloc(a, 100, 16);
    CHECK(small && big && small2);
    CHECK(small2 == small + 112 || small2 == small + 100);   /* the cursor stayed */
    memset(big, 3, 1 << 20);
    CHECK(kp_arena_reserved(a) >= (64 << 10) + (1 << 20));
    char *aligned = kp_arena_alloc(a, 100, (size_t)1 << 20);
    CHECK(aligned && (uintptr_t)aligned % ((size_t)1 << 20) == 0);
    kp_arena_destroy(a);
}

static void test_reset_keeps_the_first_chunk(void) {
    kp_arena *a = kp_arena_create(64 << 10);
    char *first = kp_arena_alloc(a, 1000, 16);
    for (int i = 0; i < 1000; i++) CHECK(kp_arena_alloc(a, 1000, 16) != NULL);
    CHECK(kp_arena_used(a) >= 1001 * 1000);
    CHECK(kp_arena_reserved(a) >= 1001 * 1000);
    kp_arena_reset(a);
    CHECK_EQ(kp_arena_used(a), 0);
    CHECK_EQ(kp_arena_reserved(a), 64 << 10);
    CHECK(kp_arena_alloc(a, 1000, 16) == first);
    kp_arena_destroy(a);
    kp_stats st = { .struct_size = sizeof st };
    kp_stats_get(&st);
    CHECK_EQ(st.bytes_arenas, 0);
}

static void test_aligned_request_after_reset_fits(void) {
    kp_arena *a = kp_arena_create(1 << 20);
    void *pad = kp_malloc(300000);               /* so the kept chunk is not 512 KiB aligned */
    char *first = kp_arena_alloc(a, 16, 16);
    kp_arena_reset(a);
    size_t align = (size_t)512 << 10;
    char *p = kp_arena_alloc(a, 1 << 20, align);
    CHECK(p != NULL && (uintptr_t)p % align == 0);
    kp_span *s = _kp_span_of(p);
    CHECK(s != NULL && s->state == KP_SPAN_ARENA);
    CHECK(s && (uintptr_t)p + (1 << 20) <= (s->start + s->npages) << KP_PAGE_SHIFT);
    (void)first;
    kp_free(pad);
    kp_arena_destroy(a);
}

static void test_bad_arguments(void) {
    CHECK(kp_arena_alloc(NULL, 1, 16) == NULL);
    kp_arena_reset(NULL);
    kp_arena_destroy(NULL);
    errno = 0;
    CHECK(kp_arena_create(SIZE_MAX) == NULL);
    CHECK_EQ(errno, EINVAL);
}

/* Out of memory (kpool.h's general rule): NULL with ENOMEM, what the arena
 * handed out stays intact, and it allocates again once memory is back. */
static void test_out_of_memory_is_enomem(void) {
    kp_trim();
    kp_arena *a = kp_arena_create(0);
    char *first = kp_arena_alloc(a, 100, 0);
    CHECK(first != NULL);
    memset(first, 7, 100);
    size_t used = kp_arena_used(a);
    _kp_os_fail_next(1000);
    errno = 0;
    void *big = kp_arena_alloc(a, (size_t)256 << 20, 0);
    int e = errno;
    _kp_os_fail_next(0);
    CHECK(big == NULL);
    CHECK_EQ(e, ENOMEM);
    CHECK_EQ(kp_arena_used(a), used);
    CHECK(first[0] == 7 && first[99] == 7);
    big = kp_arena_alloc(a, (size_t)256 << 20, 0);
    CHECK(big != NULL);
    kp_arena_destroy(a);
}

int main(void) {
    _kp_init();
    RUN(test_out_of_memory_is_enomem);
    RUN(test_bump_and_alignment);
    RUN(test_big_requests_get_their_own_chunk);
    RUN(test_reset_keeps_the_first_chunk);
    RUN(test_aligned_request_after_reset_fits);
    RUN(test_bad_arguments);
    return DONE();
}
