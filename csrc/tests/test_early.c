/* test_early.c: every public entry point works before kpool's own
 * constructor has run. The program links libkpool.a statically; its
 * constructor has priority 101, so it runs before kpool's (unprioritised)
 * one, as a C++ static initialiser or another library's constructor would.
 * Each call's result is recorded there and checked in main. */
#include "check.h"
#include "kp_internal.h"

#include <stdint.h>

static int was_initialized;   /* kpool's state when the constructor began */
static void *small, *medium, *large, *zeroed, *grown, *aligned;
static int small_errno, large_errno;
static int stats_rc, pool_ok, arena_ok, owns_small, owns_large;
static size_t usable_small;

__attribute__((constructor(101))) static void before_kpool(void) {
    was_initialized = atomic_load(&_kp_initialized);
    errno = 0;
    small = kp_malloc(16);
    small_errno = errno;
    medium = kp_malloc(100000);
    errno = 0;
    large = kp_malloc((size_t)1 << 20);
    large_errno = errno;
    zeroed = kp_calloc(10, 100);
    grown = kp_realloc(NULL, 40);
    if (grown) grown = kp_realloc(grown, 4000);
    aligned = kp_aligned_alloc(4096, 5000);
    owns_small = kp_owns(small);
    owns_large = kp_owns(large);
    usable_small = kp_usable_size(small);
    kp_stats st = { .struct_size = sizeof st };
    stats_rc = kp_stats_get(&st);
    kp_pool *pool = kp_pool_create(64, 0, 4);
    void *b = pool ? kp_pool_alloc(pool) : NULL;
    pool_ok = b != NULL;
    if (pool) kp_pool_free(pool, b);
    kp_pool_destroy(pool);
    kp_arena *arena = kp_arena_create(0);
    arena_ok = arena && kp_arena_alloc(arena, 100, 0) != NULL;
    kp_arena_destroy(arena);
}

static void test_the_constructor_ran_before_kpool_was_initialized(void) {
    CHECK_EQ(was_initialized, 0);
}

static void test_allocations_before_init_succeed(void) {
    CHECK(small != NULL);
    CHECK_EQ(small_errno, 0);
    CHECK(medium != NULL);
    CHECK(large != NULL);
    CHECK_EQ(large_errno, 0);
    CHECK(zeroed != NULL);
    int zero = 1;
    for (int i = 0; zeroed && i < 1000; i++) zero &= ((unsigned char *)zeroed)[i] == 0;
    CHECK(zero);
    CHECK(grown != NULL);
    CHECK(aligned != NULL && ((uintptr_t)aligned & 4095) == 0);
    CHECK_EQ(owns_small, 1);
    CHECK_EQ(owns_large, 1);
    CHECK_EQ(usable_small, 16);
    CHECK_EQ(stats_rc, 0);
    CHECK(pool_ok);
    CHECK(arena_ok);
}

static void test_early_blocks_are_ordinary_blocks(void) {
    /* they are usable and free like any other, and the heap is consistent */
    memset(small, 1, 16);
    memset(large, 2, (size_t)1 << 20);
    kp_free(small);
    kp_free(medium);
    kp_free(large);
    kp_free(zeroed);
    kp_free(grown);
    kp_free(aligned);
    CHECK(_kp_pageheap_is_valid());
    for (unsigned c = 1; c < KP_NUM_CLASSES; c++) CHECK(_kp_central_is_valid(c));
    kp_stats st = { .struct_size = sizeof st };
    CHECK_EQ(kp_stats_get(&st), 0);
    CHECK_EQ(st.bytes_large, 0);
}

int main(void) {
    RUN(test_the_constructor_ran_before_kpool_was_initialized);
    RUN(test_allocations_before_init_succeed);
    RUN(test_early_blocks_are_ordinary_blocks);
    return DONE();
}
