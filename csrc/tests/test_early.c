/* test_early.c: every public entry point works before kpool's own
 * constructor has run. The program links libkpool.a statically; its
 * constructor has priority 101, so it runs before kpool's (unprioritised)
 * one, as a C++ static initialiser or another library's constructor would.
 * Each call's result is recorded there and checked in main. */
#include "check.h"
#include "kp_internal.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int was_initialized;   /* kpool's state when the constructor began */
static void *small, *medium, *large, *zeroed, *grown, *aligned;
static int small_errno, large_errno;
static int stats_rc, pool_ok, arena_ok, owns_small, owns_large;
static size_t usable_small;

/* KP_FIRST_CALL=name: the constructor makes only that call, as the very
 * first one into kpool, and main reports whether its answer was right. */
static const char *const first_calls[] = {
    "kp_malloc", "kp_malloc_large", "kp_malloc_zero", "kp_calloc", "kp_calloc_large", "kp_realloc",
    "kp_realloc_sized", "kp_realloc_foreign", "kp_aligned_alloc", "kp_aligned_alloc_large", "kp_free",
    "kp_free_sized", "kp_free_foreign", "kp_usable_size", "kp_owns", "kp_thread_flush", "kp_trim",
    "kp_pool_create", "kp_arena_create", "kp_stats_get", "kp_stats_reset", "kp_stats_print",
    "kp_set_error_handler", "kp_version", NULL,
};
static int first_ok = -1;
static int early_calls;
static void count_handler(const char *call, const void *p, const char *what) {
    (void)call, (void)p, (void)what;
    early_calls++;
}

static int block_ok(void *p, size_t size, size_t align) {
    if (!p || ((uintptr_t)p & (align - 1)) || kp_usable_size(p) < size) return 0;
    memset(p, 0x5a, size);
    kp_free(p);
    return 1;
}

static int zeroed_ok(unsigned char *p, size_t n) {
    if (!p) return 0;
    for (size_t i = 0; i < n; i++)
        if (p[i]) return 0;
    kp_free(p);
    return 1;
}

static int make_first_call(const char *name) {
    int local = 0;
    if (!strcmp(name, "kp_malloc")) return block_ok(kp_malloc(100), 100, 16);
    if (!strcmp(name, "kp_malloc_large")) return block_ok(kp_malloc((size_t)1 << 20), (size_t)1 << 20, 16);
    if (!strcmp(name, "kp_malloc_zero")) return block_ok(kp_malloc(0), 0, 16);
    if (!strcmp(name, "kp_calloc")) return zeroed_ok(kp_calloc(10, 30), 300);
    if (!strcmp(name, "kp_calloc_large")) return zeroed_ok(kp_calloc(1, (size_t)1 << 20), (size_t)1 << 20);
    if (!strcmp(name, "kp_realloc")) return block_ok(kp_realloc(NULL, 40), 40, 16);
    if (!strcmp(name, "kp_realloc_sized")) return block_ok(kp_realloc_sized(NULL, 0, 40), 40, 16);
    if (!strcmp(name, "kp_realloc_foreign")) {
        kp_set_error_handler(count_handler);
        errno = 0;
        return kp_realloc(&local, 10) == NULL && errno == EINVAL && early_calls == 1;
    }
    if (!strcmp(name, "kp_aligned_alloc")) return block_ok(kp_aligned_alloc(64, 100), 100, 64);
    if (!strcmp(name, "kp_aligned_alloc_large")) return block_ok(kp_aligned_alloc((size_t)1 << 20, 100), 100, (size_t)1 << 20);
    if (!strcmp(name, "kp_free")) {
        errno = 42;
        kp_free(NULL);
        return errno == 42;
    }
    if (!strcmp(name, "kp_free_sized")) {
        kp_free_sized(NULL, 10);
        return 1;
    }
    if (!strcmp(name, "kp_free_foreign")) {
        kp_set_error_handler(count_handler);
        kp_free(&local);
        return early_calls == 1;
    }
    if (!strcmp(name, "kp_usable_size")) return kp_usable_size(&local) == 0 && kp_usable_size(NULL) == 0;
    if (!strcmp(name, "kp_owns")) return kp_owns(&local) == 0;
    if (!strcmp(name, "kp_thread_flush")) {
        kp_thread_flush();
        return block_ok(kp_malloc(16), 16, 16);
    }
    if (!strcmp(name, "kp_trim")) {
        (void)kp_trim();
        return block_ok(kp_malloc(16), 16, 16);
    }
    if (!strcmp(name, "kp_pool_create")) {
        kp_pool *pool = kp_pool_create(64, 0, 2);
        void *a = pool ? kp_pool_alloc(pool) : NULL, *b = pool ? kp_pool_alloc(pool) : NULL;
        errno = 0;
        int ok = a && b && a != b && kp_pool_alloc(pool) == NULL && errno == ENOBUFS && kp_pool_owns(pool, a);
        if (pool) {
            kp_pool_free(pool, a);
            kp_pool_free(pool, b);
        }
        kp_pool_destroy(pool);
        return ok;
    }
    if (!strcmp(name, "kp_arena_create")) {
        kp_arena *arena = kp_arena_create(0);
        char *p = arena ? kp_arena_alloc(arena, 100, 64) : NULL;
        int ok = p && ((uintptr_t)p & 63) == 0 && kp_arena_used(arena) >= 100;
        if (p) memset(p, 1, 100);
        kp_arena_destroy(arena);
        return ok;
    }
    if (!strcmp(name, "kp_stats_get")) {
        kp_stats st = { .struct_size = sizeof st };
        return kp_stats_get(&st) == 0 && st.version == KP_STATS_VERSION && st.nclasses > 0;
    }
    if (!strcmp(name, "kp_stats_reset")) {
        kp_stats_reset();
        return block_ok(kp_malloc(16), 16, 16);
    }
    if (!strcmp(name, "kp_stats_print")) {
        FILE *f = tmpfile();
        if (!f) return 0;
        kp_stats_print(f);
        int ok = ftell(f) > 0;
        fclose(f);
        return ok;
    }
    if (!strcmp(name, "kp_set_error_handler")) return kp_set_error_handler(count_handler) == NULL;
    if (!strcmp(name, "kp_version")) return kp_version() && kp_version()[0] != 0;
    return 0;
}

__attribute__((constructor(101))) static void before_kpool(void) {
    was_initialized = atomic_load(&_kp_initialized);
    const char *first = getenv("KP_FIRST_CALL");
    if (first) {
        first_ok = make_first_call(first);
        return;
    }
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

/* Each entry point as the very first call into kpool, in a child. */
static void test_every_function_works_as_the_first_call(void) {
    for (int i = 0; first_calls[i]; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            setenv("KP_FIRST_CALL", first_calls[i], 1);
            execl("/proc/self/exe", "test_early", (char *)NULL);
            _exit(127);
        }
        int status = 0;
        CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) printf("     first call %s: status %#x\n", first_calls[i], status);
    }
}

int main(void) {
    if (getenv("KP_FIRST_CALL")) {   /* a child of the test above */
        int ok = was_initialized == 0 && first_ok == 1 && _kp_pageheap_is_valid();
        return ok ? 0 : 1;
    }
    RUN(test_the_constructor_ran_before_kpool_was_initialized);
    RUN(test_every_function_works_as_the_first_call);
    RUN(test_allocations_before_init_succeed);
    RUN(test_early_blocks_are_ordinary_blocks);
    return DONE();
}
