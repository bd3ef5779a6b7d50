/* test_harden.c: what the hardening (KP_HARDEN, on by default) catches in a
 * release build. Each test is a detection; `make harden-check` links this
 * program to a KP_HARDEN=0 build and expects every test to fail there, so
 * each one shows a detection that compiling it out loses.
 * Usage: test_harden [TEST]   (no argument: all of them) */
#include "check.h"
#include "kp_internal.h"

#include <errno.h>
#include <string.h>

static int handler_calls;
static const char *handler_what;
static void record_handler(const char *call, const void *ptr, const char *what) {
    (void)call, (void)ptr;
    handler_calls++;
    handler_what = what;
}

/* a, b, a: the second free of a is not the thread's last free. */
static void test_non_consecutive_double_free(void) {
    handler_calls = 0;
    char *a = kp_malloc(48), *b = kp_malloc(48);
    kp_free(a);
    kp_free(b);
    kp_free(a);
    CHECK_EQ(handler_calls, 1);
    CHECK(handler_what && strstr(handler_what, "double free"));
    char *x = kp_malloc(48), *y = kp_malloc(48), *z = kp_malloc(48);
    CHECK(x != y && y != z && x != z);         /* no block handed out twice */
    kp_free(x), kp_free(y), kp_free(z);
}

static void *free_it(void *p) {
    kp_free(p);
    return NULL;
}

/* A double free long after the first, from another thread. */
static void test_double_free_ordered_across_threads(void) {
    handler_calls = 0;
    char *a = kp_malloc(200);
    void *others[64];
    for (int i = 0; i < 64; i++) others[i] = kp_malloc(200);
    kp_free(a);
    for (int i = 0; i < 64; i++) kp_free(others[i]);
    pthread_t t;
    pthread_create(&t, NULL, free_it, a);
    pthread_join(t, NULL);
    CHECK_EQ(handler_calls, 1);
}

/* A write to a freed block's link (use after free) is caught at the pop
 * that would follow it, and the address written is never handed out. */
static void test_use_after_free_write_is_caught_at_the_next_pop(void) {
    static char target[256] __attribute__((aligned(64)));
    handler_calls = 0;
    char *a = kp_malloc(64), *b = kp_malloc(64);
    kp_free(a);
    kp_free(b);                                /* list: b -> a */
    *(void **)b = target;                      /* the write after free */
    int handed_target = 0;
    void *got[4];
    for (int i = 0; i < 4; i++) {
        got[i] = kp_malloc(64);
        if (got[i] == (void *)target) handed_target = 1;
    }
    CHECK(!handed_target);
    CHECK(handler_calls >= 1);
    CHECK(handler_what && strstr(handler_what, "written after it was freed"));
    for (int i = 0; i < 4; i++)
        if (got[i] != (void *)target) kp_free(got[i]);
}

/* Whatever whole word a use after free writes over a free block's link
 * is caught at the pop that would follow it: zero, small integers of
 * either sign (each low nibble among them), pointers, text. */
static void test_any_word_written_over_a_link_is_caught(void) {
    static char target[256] __attribute__((aligned(64)));
    int local;
    const uintptr_t words[] = {
        0, 1, 7, 9, 11, 13, 15, 16, 255, (uintptr_t)-1, (uintptr_t)-9, (uintptr_t)-16, (uintptr_t)-4096,
        (uintptr_t)target, (uintptr_t)target + 9, (uintptr_t)&local, 0x4141414141414141u, 0x00007ffff7a0b0c9u,
    };
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
        handler_calls = 0;
        handler_what = NULL;
        char *a = kp_malloc(64), *b = kp_malloc(64);
        kp_free(a);
        kp_free(b);                            /* list: b -> a */
        *(uintptr_t *)b = words[i];
        void *got[3];
        for (int k = 0; k < 3; k++) got[k] = kp_malloc(64);
        CHECK_EQ(handler_calls, 1);
        CHECK(handler_what && strstr(handler_what, "written after it was freed"));
        for (int k = 0; k < 3; k++) {
            /* nothing wild handed out: each is a live block of kpool's */
            CHECK(kp_usable_size(got[k]) == 64);
            if (kp_usable_size(got[k]) != 64) printf("     word %#zx: handed out %p\n", (size_t)words[i], got[k]);
        }
        for (int k = 0; k < 3; k++)
            if (kp_usable_size(got[k]) == 64) kp_free(got[k]);
    }
}

/* An overflow from a live block that zeroes the free block after it. */
static void test_overflow_into_a_free_block_is_caught(void) {
    handler_calls = 0;
    char *v[3];
    for (int i = 0; i < 3; i++) v[i] = kp_malloc(32);
    /* three blocks of one fresh batch: find two neighbours */
    char *low = v[0] < v[1] ? v[0] : v[1], *high = v[0] < v[1] ? v[1] : v[0];
    if (high != low + 32) {
        printf("     skipped: no adjacent pair\n");
        return;
    }
    kp_free(v[2]);
    kp_free(high);                             /* list: high -> v[2] */
    memset(low, 0, 48);                        /* 16 bytes past low's end: high's link */
    void *got = kp_malloc(32);                 /* high; its zeroed link is caught here */
    CHECK_EQ(handler_calls, 1);
    CHECK(got == high);
}

/* Pool lists are encoded too. */
static void test_pool_link_damage_is_caught(void) {
    static char target[512] __attribute__((aligned(64)));
    handler_calls = 0;
    kp_pool *pool = kp_pool_create(64, 0, 0);
    char *a = kp_pool_alloc(pool), *b = kp_pool_alloc(pool);
    kp_pool_free(pool, a);
    kp_pool_free(pool, b);
    *(void **)b = target;
    int handed_target = 0;
    for (int i = 0; i < 4; i++)
        if (kp_pool_alloc(pool) == (void *)target) handed_target = 1;
    CHECK(!handed_target);
    CHECK(handler_calls >= 1);
    kp_pool_destroy(pool);
}

/* A block handed out shows neither its own free-list link nor its free
 * mark (kpool.h). */
static void test_handed_out_block_shows_no_link_or_mark(void) {
    uintptr_t *a = kp_malloc(48), *b = kp_malloc(48);
    kp_free(b);
    kp_free(a);                       /* a's link leads to b; a is marked free */
    uintptr_t *again = kp_malloc(48);
    CHECK(again == a);                /* the thread's list is last in, first out */
    CHECK_EQ(again[0], 0);
    CHECK_EQ(again[1], 0);
    kp_free(again);
}

/* kp_realloc of a freed small block, not the thread's last free: the
 * handler, NULL with EINVAL, and nothing is freed or allocated. */
static void test_realloc_of_a_freed_block_does_nothing(void) {
    handler_calls = 0;
    char *a = kp_malloc(48), *b = kp_malloc(48);
    kp_free(a);
    kp_free(b);
    kp_stats before = {.struct_size = sizeof before}, after = {.struct_size = sizeof after};
    kp_stats_get(&before);
    const size_t sizes[] = {0, 40, 100};   /* would free, keep in place (48-byte class), move */
    for (int i = 0; i < 3; i++) {
        errno = 0;
        CHECK(kp_realloc(a, sizes[i]) == NULL);
        CHECK_EQ(errno, EINVAL);
    }
    kp_stats_get(&after);
    CHECK_EQ(handler_calls, 3);
    CHECK(handler_what && strstr(handler_what, "freed block"));
    CHECK_EQ(after.allocs, before.allocs);
    CHECK_EQ(after.bytes_in_use, before.bytes_in_use);
    char *x = kp_malloc(48), *y = kp_malloc(48), *z = kp_malloc(48);
    CHECK(x != y && y != z && x != z);         /* a and b each handed out once */
    kp_free(x), kp_free(y), kp_free(z);
}

/* kpool.h: a freed small block's start answers 0, told by its free mark;
 * the thread's last free and one behind it, in classes 16 to 1024. */
static void test_usable_size_of_a_freed_block_is_zero(void) {
    const size_t sizes[] = {16, 48, 100, 1024};
    for (int i = 0; i < 4; i++) {
        char *a = kp_malloc(sizes[i]), *b = kp_malloc(sizes[i]);
        size_t usable = kp_usable_size(a);
        CHECK(usable >= sizes[i] && kp_usable_size(b) == usable);
        kp_free(a);
        kp_free(b);
        CHECK_EQ(kp_usable_size(a), 0);
        CHECK_EQ(kp_usable_size(b), 0);
        char *again = kp_malloc(sizes[i]);
        CHECK_EQ(kp_usable_size(again), usable);   /* handed out again: live */
        kp_free(again);
    }
}

int main(int argc, char **argv) {
    _kp_init();
    kp_set_error_handler(record_handler);
    const char *only = argc > 1 ? argv[1] : NULL;
#define MAYBE(fn) do { if (!only || strcmp(only, #fn) == 0) RUN(fn); } while (0)
    MAYBE(test_non_consecutive_double_free);
    MAYBE(test_double_free_ordered_across_threads);
    MAYBE(test_use_after_free_write_is_caught_at_the_next_pop);
    MAYBE(test_any_word_written_over_a_link_is_caught);
    MAYBE(test_overflow_into_a_free_block_is_caught);
    MAYBE(test_pool_link_damage_is_caught);
    MAYBE(test_handed_out_block_shows_no_link_or_mark);
    MAYBE(test_realloc_of_a_freed_block_does_nothing);
    MAYBE(test_usable_size_of_a_freed_block_is_zero);
    return DONE();
}
