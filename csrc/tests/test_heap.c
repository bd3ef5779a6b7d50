/* test_heap.c: the general heap API: limits, bad input, misuse reaching the
 * error handler, alignment, realloc, ownership, fork, memory going back to
 * the OS. */
#include "check.h"
#include "kp_internal.h"

#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

/* make valgrind: this test also runs under memcheck (KP_VALGRIND=1 build),
 * where RSS, page faults and RLIMIT_AS count valgrind's shadow memory too. */
#if KP_VALGRIND
#include <valgrind/valgrind.h>
#define UNDER_VALGRIND() RUNNING_ON_VALGRIND
#else
#define UNDER_VALGRIND() 0
#endif

static int handler_calls;
static const char *handler_call, *handler_what;
static const void *handler_ptr;
static void record_handler(const char *call, const void *ptr, const char *what) {
    handler_calls++;
    handler_call = call;
    handler_ptr = ptr;
    handler_what = what;
}

static void test_malloc_zero_is_unique_and_freeable(void) {
    void *a = kp_malloc(0), *b = kp_malloc(0);
    CHECK(a && b && a != b);
    CHECK(kp_owns(a));
    kp_free(a);
    kp_free(b);
    kp_free(NULL);
    kp_free_sized(NULL, 10);
}

static void test_alignment_of_every_class(void) {
    for (size_t s = 1; s <= 70000; s += (s < 2048 ? 1 : 97)) {
        void *p = kp_malloc(s);
        CHECK(p != NULL);
        if (((uintptr_t)p & 15) != 0) { CHECK(!"16-byte alignment"); kp_free(p); return; }
        size_t cs = kp_usable_size(p);
        if (_kp_is_pow2(cs) && cs <= KP_PAGE_SIZE && ((uintptr_t)p & (cs - 1))) CHECK(!"natural alignment");
        memset(p, 0xab, s);
        kp_free(p);
    }
}

static void test_calloc_overflow_and_huge_sizes(void) {
    errno = 0;
    CHECK(kp_calloc(SIZE_MAX / 2, 3) == NULL);
    CHECK_EQ(errno, ENOMEM);
    errno = 0;
    CHECK(kp_malloc(SIZE_MAX) == NULL);
    CHECK_EQ(errno, ENOMEM);
    errno = 0;
    CHECK(kp_malloc(SIZE_MAX - 4096) == NULL);
    CHECK_EQ(errno, ENOMEM);
    errno = 0;
    CHECK(kp_aligned_alloc(64, SIZE_MAX - 10) == NULL);
    CHECK_EQ(errno, ENOMEM);
    errno = 0;
    CHECK(kp_aligned_alloc((size_t)1 << 20, SIZE_MAX - 10) == NULL);
    CHECK_EQ(errno, ENOMEM);
    unsigned char *z = kp_calloc(100, 100);
    CHECK(z != NULL);
    int zero = 1;
    for (int i = 0; i < 10000; i++) zero &= z[i] == 0;
    CHECK(zero);
    kp_free(z);
    void *p = kp_malloc(64);   /* the heap still works */
    CHECK(p != NULL);
    kp_free(p);
}

static void test_aligned_alloc(void) {
    errno = 0;
    CHECK(kp_aligned_alloc(3, 10) == NULL);
    CHECK_EQ(errno, EINVAL);
    errno = 0;
    CHECK(kp_aligned_alloc(0, 10) == NULL);
    CHECK_EQ(errno, EINVAL);
    for (size_t a = 1; a <= ((size_t)1 << 26); a *= 2) {
        size_t sizes[] = { 1, 100, 5000, 300000 };
        for (int i = 0; i < 4; i++) {
            char *p = kp_aligned_alloc(a, sizes[i]);
            CHECK(p != NULL);
            CHECK(((uintptr_t)p % a) == 0);
            CHECK(kp_usable_size(p) >= sizes[i]);
            p[0] = 1;
            p[sizes[i] - 1] = 2;
            kp_free(p);
        }
    }
}

static void test_realloc(void) {
    char *p = kp_realloc(NULL, 10);
    CHECK(p != NULL);
    memcpy(p, "abcdefghi", 10);
    char *q = kp_realloc(p, 5000);
    CHECK(q != NULL && memcmp(q, "abcdefghi", 10) == 0);
    char *r = kp_realloc(q, 1 << 20);
    CHECK(r != NULL && memcmp(r, "abcdefghi", 10) == 0);
    char *s = kp_realloc(r, 12);
    CHECK(s != NULL && memcmp(s, "abcdefghi", 10) == 0);
    CHECK(kp_usable_size(s) < 1000);      /* shrinking a large block moves it */
    /* kp_realloc(p, 0) frees p and returns a unique, freeable pointer */
    void *t = kp_realloc(s, 0);
    CHECK(t != NULL);
    CHECK(kp_owns(t));
    kp_free(t);
    /* growth within the class keeps the block */
    char *u = kp_malloc(100);
    CHECK(kp_realloc(u, 110) == u);
    memset(u, 'u', 110);
    errno = 0;
    CHECK(kp_realloc(u, SIZE_MAX) == NULL);   /* failure leaves u intact */
    CHECK_EQ(errno, ENOMEM);
    CHECK(kp_usable_size(u) >= 110 && u[0] == 'u' && u[109] == 'u');
    kp_free(u);
    /* A large block too: sizes near SIZE_MAX, whose page count would wrap
     * to 0, and sizes past what a mapping can be, fail the same way. */
    const size_t huge[] = {SIZE_MAX, SIZE_MAX - 4096, SIZE_MAX - (1 << 13) + 1, (size_t)1 << 63, (size_t)1 << 48};
    char *big = kp_malloc(1 << 20);
    CHECK(big != NULL);
    memset(big, 'b', 1 << 20);
    size_t big_usable = kp_usable_size(big);
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
        errno = 0;
        CHECK(kp_realloc(big, huge[i]) == NULL);
        CHECK_EQ(errno, ENOMEM);
        errno = 0;
        CHECK(kp_realloc_sized(big, 1 << 20, huge[i]) == NULL);
        CHECK_EQ(errno, ENOMEM);
        CHECK_EQ(kp_usable_size(big), big_usable);
        CHECK(kp_owns(big) && big[0] == 'b' && big[(1 << 20) - 1] == 'b');
    }
    char *other = kp_malloc(1 << 20);   /* big's pages are still its own */
    CHECK(other != NULL && (other + (1 << 20) <= big || other >= big + big_usable));
    kp_free(other);
    kp_free(big);
}

static void test_realloc_in_place_keeps_requested_bytes(void) {
    kp_stats a = { .struct_size = sizeof a }, b = { .struct_size = sizeof b };
    kp_stats_get(&a);
    char *p = kp_malloc(300000);
    char *q = kp_realloc(p, 200000);
    CHECK(q == p);
    kp_stats_get(&b);
    CHECK_EQ(b.bytes_requested - a.bytes_requested, 200000);
    kp_free_sized(q, 200000);
}

static void test_usable_size_and_owns(void) {
    int local = 0;
    static int global;
    void *libc = malloc(32);
    CHECK(!kp_owns(&local));
    CHECK(!kp_owns(&global));
    CHECK(!kp_owns(libc));
    CHECK(!kp_owns(NULL));
    CHECK_EQ(kp_usable_size(NULL), 0);
    CHECK_EQ(kp_usable_size(&local), 0);
    free(libc);
    char *p = kp_malloc(100);
    CHECK(kp_owns(p) && kp_owns(p + 99));
    CHECK_EQ(kp_usable_size(p), 112);
    kp_free(p);
    char *big = kp_malloc(300000);
    CHECK(kp_owns(big) && kp_owns(big + 299999));
    CHECK(kp_usable_size(big) >= 300000);
    kp_free(big);
    CHECK(!kp_owns(big));        /* its span went back to the page heap */
}

/* One rule: a live block's start gives its usable bytes, anything else 0. */
static void test_usable_size_rule(void) {
    char *small = kp_malloc(100), *large = kp_malloc(300000);
    CHECK_EQ(kp_usable_size(small), 112);
    CHECK_EQ(kp_usable_size(small + 1), 0);
    CHECK_EQ(kp_usable_size(small + 50), 0);
    CHECK(kp_usable_size(large) >= 300000);
    CHECK_EQ(kp_usable_size(large + 8192), 0);
    CHECK_EQ(kp_usable_size(large + 100), 0);
    kp_pool *pool = kp_pool_create(100, 0, 0);
    char *pb = kp_pool_alloc(pool);
    CHECK_EQ(kp_usable_size(pb), kp_pool_block_size(pool));
    CHECK_EQ(kp_usable_size(pb + 16), 0);
    char *pb_freed = kp_pool_alloc(pool);
    kp_pool_free(pool, pb_freed);
    CHECK_EQ(kp_usable_size(pb_freed), 0);       /* a freed pool block: its free mark says so */
    kp_arena *arena = kp_arena_create(0);
    char *ab = kp_arena_alloc(arena, 100, 0);
    CHECK(kp_owns(ab) && kp_owns(ab + 99));       /* kpool's memory ... */
    CHECK_EQ(kp_usable_size(ab), 0);             /* ... but arena blocks have no size of their own */
    kp_arena_destroy(arena);
    kp_pool_free(pool, pb);
    kp_pool_destroy(pool);
    kp_free(small);
    kp_free(large);

    /* Every slot of a small span that is not a live block answers 0: slots
     * freed, slots carved onto a free list and never handed out, slots never
     * carved; and so does the span's tail past its last slot. Blocks are
     * taken until one comes from a span whose bump cursor is short of its
     * end (a fresh span, once the partly used ones are full). */
    const unsigned cls = _kp_size_class(48);
    const kp_class_info *ci = &_kp_classes[cls];
    CHECK(ci->objects * ci->size < ci->npages * KP_PAGE_SIZE);   /* the class has a tail */
    enum { HELD = 20000 };
    static char *held[HELD];
    kp_span *span = NULL;
    int n = 0;
    while (n < HELD && !span) {
        held[n] = kp_malloc(48);
        kp_span *sp = _kp_pagemap_get((uintptr_t)held[n++] >> KP_PAGE_SHIFT);
        if (sp && __atomic_load_n(&sp->carved, __ATOMIC_ACQUIRE) < sp->capacity) span = sp;
    }
    CHECK(span != NULL);
    if (!span) return;
    for (int k = 0; k < 8; k++) held[n++] = kp_malloc(48);   /* more from its batch */
    for (int i = n - 1; i >= 0; i -= 2) {   /* every other one freed: holes among live slots */
        kp_free(held[i]);
        held[i] = NULL;
    }
    char *base = (char *)(span->start << KP_PAGE_SHIFT);
    unsigned live_seen = 0, free_seen = 0, never_seen = 0;
    for (unsigned slot = 0; slot < ci->objects; slot++) {
        char *at = base + (size_t)slot * ci->size;
        int mine = 0;
        for (int i = 0; i < n; i++) mine |= held[i] == at;
        CHECK_EQ(kp_usable_size(at), mine ? ci->size : 0);
        CHECK(kp_owns(at) && kp_owns(at + ci->size - 1));   /* kpool's pages, live or not */
        live_seen += mine;
        free_seen += !mine && slot < span->carved;
        never_seen += slot >= span->carved;
    }
    CHECK(live_seen > 0 && free_seen > 0 && never_seen > 0);
    CHECK_EQ(kp_usable_size(base + (size_t)ci->objects * ci->size), 0);
    for (int i = 0; i < n; i++) kp_free(held[i]);
}

/* kp_realloc_sized's misuse is kp_realloc's, and its reports name kp_realloc. */
static void test_realloc_sized_misuse_is_realloc_misuse(void) {
    kp_set_error_handler(record_handler);
    int local = 0;
    handler_calls = 0;
    handler_call = NULL;
    errno = 0;
    CHECK(kp_realloc_sized(&local, 8, 16) == NULL);
    CHECK_EQ(errno, EINVAL);
    CHECK_EQ(handler_calls, 1);
    CHECK(handler_call && strcmp(handler_call, "kp_realloc") == 0 && handler_ptr == &local);
    kp_pool *pool = kp_pool_create(64, 0, 0);
    void *pb = kp_pool_alloc(pool);
    errno = 0;
    CHECK(kp_realloc_sized(pb, 64, 100) == NULL);   /* a pool block */
    CHECK_EQ(errno, EINVAL);
    CHECK_EQ(handler_calls, 2);
    CHECK(kp_pool_owns(pool, pb));                   /* still the pool's, live */
    kp_pool_free(pool, pb);
    kp_pool_destroy(pool);
    char *big = kp_malloc(1 << 20);
    errno = 0;
    CHECK(kp_realloc_sized(big + 4096, 1 << 20, 10) == NULL);   /* inside a large block */
    CHECK_EQ(errno, EINVAL);
    CHECK_EQ(handler_calls, 3);
    CHECK(handler_call && strcmp(handler_call, "kp_realloc") == 0);
    kp_free(big);
    if (KP_HARDEN_MARKS) {                              /* a freed small block, not the last freed */
        char *a = kp_malloc(40), *b = kp_malloc(40);
        kp_free(a);
        kp_free(b);
        errno = 0;
        CHECK(kp_realloc_sized(a, 40, 48) == NULL);
        CHECK_EQ(errno, EINVAL);
        CHECK_EQ(handler_calls, 4);
        void *again1 = kp_malloc(40), *again2 = kp_malloc(40);   /* both come back once each */
        CHECK((again1 == b && again2 == a) || (again1 == a && again2 == b));
        kp_free(again1);
        kp_free(again2);
    }
    kp_set_error_handler(NULL);
}

/* kp_realloc of what is not a live heap block: the handler, then nothing. */
static void test_realloc_of_a_non_block_does_nothing(void) {
    kp_set_error_handler(record_handler);
    int local = 0;
    kp_stats a = { .struct_size = sizeof a }, b = { .struct_size = sizeof b };
    kp_stats_get(&a);
    handler_calls = 0;
    errno = 0;
    CHECK(kp_realloc(&local, 0) == NULL);
    CHECK_EQ(errno, EINVAL);
    errno = 0;
    CHECK(kp_realloc(&local, 100) == NULL);
    CHECK_EQ(errno, EINVAL);
    void *big = kp_malloc(1 << 20);
    kp_free(big);
    CHECK(kp_realloc(big, 0) == NULL);           /* a freed large block */
    CHECK_EQ(handler_calls, 3);
    kp_stats_get(&b);
    CHECK_EQ(b.allocs - a.allocs, 1);            /* only the kp_malloc above */
    CHECK_EQ(b.bytes_in_use, a.bytes_in_use);
    kp_set_error_handler(NULL);
}

/* A large double free is told apart from a pointer kpool never mapped. */
static void test_large_double_free_has_its_own_message(void) {
    kp_set_error_handler(record_handler);
    void *big = kp_malloc(1 << 20);
    kp_free(big);
    kp_free(big);
    const char *twice = handler_what;
    int local = 0;
    kp_free(&local);
    const char *foreign = handler_what;
    CHECK(twice && foreign && strcmp(twice, foreign) != 0);
    CHECK(twice && strstr(twice, "double free") != NULL);
    CHECK(foreign && strstr(foreign, "not allocated by kpool") != NULL);
    kp_set_error_handler(NULL);
}

/* What only a KP_DEBUG build detects for small blocks (kpool.h). */
static void test_debug_build_detects_small_block_misuse(void) {
    if (!KP_DEBUG) {
        printf("     skipped: a release build does not detect these (kpool.h)\n");
        return;
    }
    kp_set_error_handler(record_handler);
    handler_calls = 0;
    char *a = kp_malloc(48), *b = kp_malloc(48);
    kp_free(a);
    kp_free(b);
    kp_free(a);                                  /* not consecutive */
    CHECK_EQ(handler_calls, 1);
    char *c = kp_malloc(48);
    kp_free(c + 16);                             /* inside a block */
    CHECK_EQ(handler_calls, 2);
    kp_free(c);
    char *d = kp_malloc(3000);
    kp_free(d + 3008 * 2);                       /* a slot of the span not handed out */
    CHECK_EQ(handler_calls, 3);
    /* kp_realloc to a size the block would keep in place tells them too */
    char *e = kp_malloc(48);
    errno = 0;
    CHECK(kp_realloc(e + 16, 40) == NULL);
    CHECK_EQ(errno, EINVAL);
    CHECK_EQ(handler_calls, 4);
    CHECK(handler_call && strcmp(handler_call, "kp_realloc") == 0);
    errno = 0;
    CHECK(kp_realloc(d + 3008 * 2, 2000) == NULL);
    CHECK_EQ(errno, EINVAL);
    CHECK_EQ(handler_calls, 5);
    CHECK(kp_realloc(e, 40) == e);              /* the live block itself is kept */
    CHECK_EQ(handler_calls, 5);
    kp_free(e);
    kp_free(d);
    kp_set_error_handler(NULL);
}

static void test_misuse_reaches_the_handler(void) {
    kp_error_handler prev = kp_set_error_handler(record_handler);
    CHECK(prev == NULL);
    int local = 0;
    handler_calls = 0;
    kp_free(&local);
    CHECK_EQ(handler_calls, 1);
    CHECK(handler_call && strcmp(handler_call, "kp_free") == 0 && handler_ptr == &local);
    void *libc = malloc(64);
    kp_free(libc);
    CHECK_EQ(handler_calls, 2);
    free(libc);
    /* double free: the block is at the head of this thread's list */
    void *p = kp_malloc(48);
    kp_free(p);
    kp_free(p);
    CHECK_EQ(handler_calls, 3);
    /* double free of a large block: its span is free */
    void *big = kp_malloc(1 << 20);
    kp_free(big);
    kp_free(big);
    CHECK_EQ(handler_calls, 4);
    /* interior pointer of a large block */
    char *big2 = kp_malloc(1 << 20);
    kp_free(big2 + 100);
    CHECK_EQ(handler_calls, 5);
    kp_free(big2);
    /* a size larger than the block */
    void *s = kp_malloc(16);
    if (KP_DEBUG) {
        kp_free_sized(s, 4000);
        CHECK_EQ(handler_calls, 6);
        handler_calls = 5;
    }
    kp_free_sized(s, 16);
    CHECK_EQ(kp_realloc(&local, 10) == NULL, 1);
    CHECK_EQ(handler_calls, 6);
    kp_pool *pool = kp_pool_create(64, 0, 0);
    void *pb = kp_pool_alloc(pool);
    CHECK(kp_realloc(pb, 60) == NULL);     /* pool blocks are not kp_realloc's */
    CHECK_EQ(handler_calls, 7);
    kp_pool_free(pool, pb);
    kp_pool_destroy(pool);
    kp_set_error_handler(NULL);
}

static void test_map_failure_then_recovery(void) {
    _kp_os_fail_next(1 << 20);
    errno = 0;
    void *p = kp_malloc((size_t)2 << 30);
    CHECK(p == NULL);
    CHECK_EQ(errno, ENOMEM);
    _kp_os_fail_next(0);
    p = kp_malloc((size_t)64 << 20);
    CHECK(p != NULL);
    kp_free(p);
    void *q = kp_malloc(24);
    CHECK(q != NULL);
    kp_free(q);
}

/* When the page heap has no struct for the rest of a span it carves, the
 * whole span goes out with the block: the heap's figures must count the
 * pages the span really has, and give back as many at the free. */
static void test_large_block_with_an_uncarved_span(void) {
    void *warm = kp_malloc((size_t)1 << 20);   /* the page heap holds a free span after this */
    CHECK(warm != NULL);
    kp_free(warm);
    kp_stats before = { .struct_size = sizeof before }, during = { .struct_size = sizeof during },
             after = { .struct_size = sizeof after };
    CHECK_EQ(kp_stats_get(&before), 0);
    _kp_meta_fail_next(1);
    void *p = kp_malloc((size_t)512 << 10);   /* a large block: above KP_SMALL_MAX */
    _kp_meta_fail_next(0);
    CHECK(p != NULL);
    CHECK(kp_usable_size(p) > ((size_t)512 << 10));  /* the rest of the span came along */
    CHECK_EQ(kp_stats_get(&during), 0);
    CHECK_EQ(during.bytes_large - before.bytes_large, kp_usable_size(p));
    CHECK_EQ(during.bytes_in_use - before.bytes_in_use, kp_usable_size(p));
    kp_free(p);
    CHECK_EQ(kp_stats_get(&after), 0);
    CHECK_EQ(after.bytes_in_use, before.bytes_in_use);
    CHECK_EQ(after.bytes_large, before.bytes_large);
    CHECK(_kp_pageheap_is_valid());
}

static void *fork_worker(void *arg) {
    volatile int *stop = arg;
    void *slots[64] = {0};
    unsigned i = 0;
    while (!__atomic_load_n(stop, __ATOMIC_RELAXED)) {
        unsigned k = i++ % 64;
        kp_free(slots[k]);
        slots[k] = kp_malloc(16 + (i * 37) % 3000);
    }
    for (int k = 0; k < 64; k++) kp_free(slots[k]);
    return NULL;
}

static void test_fork_while_threads_allocate(void) {
    pthread_t t[2];
    int stop = 0;
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, fork_worker, &stop);
    for (int round = 0; round < 20; round++) {
        pid_t pid = fork();
        if (pid == 0) {
            void *v[1000];
            for (int i = 0; i < 1000; i++) v[i] = kp_malloc((size_t)i * 13 + 1);
            for (int i = 0; i < 1000; i++) kp_free(v[i]);
            void *big = kp_malloc(1 << 22);
            kp_free(big);
            kp_trim();
            _exit(0);
        }
        int status = 0;
        CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    __atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
}

static size_t rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    size_t pages = 0, res = 0;
    if (f) {
        if (fscanf(f, "%zu %zu", &pages, &res) != 2) res = 0;
        fclose(f);
    }
    return res * (size_t)sysconf(_SC_PAGESIZE);
}

static void test_memory_goes_back_without_trim(void) {
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
    printf("     skipped: a sanitizer's shadow memory makes RSS meaningless\n");
    return;
#endif
    if (UNDER_VALGRIND()) {
        printf("     skipped: valgrind's shadow memory makes RSS meaningless\n");
        return;
    }
    const char *env = getenv("KP_TEST_BURST_MB");
    size_t total = (size_t)(env ? atoi(env) : 1024) << 20;
    size_t n = total / 2080 + 1;
    void **v = malloc(n * sizeof *v);
    size_t start = rss_bytes(), bytes = 0, count = 0;
    unsigned seed = 7;
    while (bytes < total && count < n) {
        seed = seed * 1103515245u + 12345u;
        size_t s = 64 + (seed >> 8) % (4096 - 64 + 1);
        v[count] = kp_malloc(s);
        memset(v[count], 1, s);
        bytes += s;
        count++;
    }
    size_t peak = rss_bytes();
    for (size_t i = 0; i < count; i++) kp_free(v[i]);
    free(v);
    usleep(1000 * 1000);
    size_t after = rss_bytes();
    printf("     burst %zu MiB: rss start %zu MiB, full %zu MiB, after free + 1 s %zu MiB\n", total >> 20,
           start >> 20, peak >> 20, after >> 20);
    CHECK(after <= start + peak / 20 + ((size_t)16 << 20));
}

static size_t rss_bytes(void);

static long minor_faults(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt;
}

/* calloc of pages that are zero already (fresh from the OS, or given back
 * with MADV_DONTNEED) does not write them: they stay out of RSS. */
static void test_calloc_does_not_touch_zero_pages(void) {
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
    printf("     skipped: a sanitizer's shadow memory makes RSS meaningless\n");
    return;
#endif
    enum { N = 8 };
    size_t gib = (size_t)1 << 30;
    size_t before = rss_bytes();
    unsigned char *v[N];
    for (int i = 0; i < N; i++) {
        v[i] = kp_calloc(1, gib);
        CHECK(v[i] != NULL);
        if (!v[i]) return;
        CHECK(v[i][0] == 0 && v[i][gib / 2] == 0 && v[i][gib - 1] == 0);
    }
    size_t during = rss_bytes();
    for (int i = 0; i < N; i++) kp_free(v[i]);
    /* once more: the freed spans went back to the OS, so they are zero again */
    unsigned char *again = kp_calloc(gib, 1);
    CHECK(again != NULL && again[12345] == 0);
    size_t after = rss_bytes();
    kp_free(again);
    printf("     8 x calloc(1 GiB): rss %zu MiB -> %zu MiB; once more after freeing: %zu MiB\n", before >> 20,
           during >> 20, after >> 20);
    CHECK(during < before + ((size_t)32 << 20));
    CHECK(after < before + ((size_t)32 << 20));
    /* a calloc of pages that were written is still zeroed */
    unsigned char *dirty = kp_malloc((size_t)1 << 20);
    memset(dirty, 0xab, (size_t)1 << 20);
    kp_free(dirty);
    unsigned char *z = kp_calloc(1, (size_t)1 << 20);
    int zero = 1;
    for (size_t i = 0; i < ((size_t)1 << 20); i += 4096) zero &= z[i] == 0;
    CHECK(zero);
    kp_free(z);
}

/* Growing a large block: in place into the free pages after it, else its
 * pages move (mremap) with room to spare; its bytes are never copied, so
 * growing a buffer in 16 KiB steps to 64 MiB faults in about one page per
 * step, not the whole buffer at every step. */
static void test_realloc_grows_large_blocks_without_copying(void) {
    kp_trim();                                  /* the page heap's free spans are plain free spans */
    char *p = kp_malloc((size_t)300 << 10), *after = NULL;
    p[0] = 'a';
    char *q = kp_realloc(p, (size_t)400 << 10);   /* the pages after it are free */
    CHECK(q == p);
    after = kp_malloc((size_t)300 << 10);      /* now they are not */
    q[(400 << 10) - 1] = 'z';
    long f0 = minor_faults();
    char *r = kp_realloc(q, (size_t)8 << 20);  /* moves */
    long moved_faults = minor_faults() - f0;
    (void)moved_faults;
    CHECK(r != NULL && r[0] == 'a' && r[(400 << 10) - 1] == 'z');
#if !defined(__SANITIZE_THREAD__)                /* its shadow memory faults in for the new range */
    if (!UNDER_VALGRIND()) CHECK(moved_faults < 20);                  /* a copy would fault in every page of the old block's copy */
#endif
    CHECK(kp_usable_size(r) >= ((size_t)8 << 20));
    CHECK(_kp_pageheap_is_valid());
    kp_free(after);
    /* step by step to 64 MiB */
    size_t n = (size_t)16 << 10;
    char *g = kp_malloc(n);
    long f1 = minor_faults();
    int errno_kept = 1;
    while (n < ((size_t)64 << 20)) {
        n += (size_t)16 << 10;
        errno = 0;
        g = kp_realloc(g, n);
        if (!g) break;
        errno_kept &= errno == 0;   /* success leaves errno alone (the mapping probes once set ENOMEM) */
        g[n - 1] = (char)n;
    }
    long grow_faults = minor_faults() - f1;
    CHECK(g != NULL);
    CHECK(errno_kept);
    int intact = 1;
    for (size_t k = (size_t)32 << 10; g && k <= n; k += (size_t)16 << 10) intact &= g[k - 1] == (char)k;
    CHECK(intact);
    printf("     realloc to 64 MiB in 16 KiB steps: %ld minor faults\n", grow_faults);
#if !defined(__SANITIZE_THREAD__)
    if (!UNDER_VALGRIND()) CHECK(grow_faults < 20000);                 /* 4096 steps, about one new page each */
#endif
    kp_free(g);
    kp_free(r);
    CHECK(_kp_pageheap_is_valid());
    /* and shrinking gives the tail back in place */
    char *big = kp_malloc((size_t)4 << 20);
    char *small = kp_realloc(big, (size_t)1 << 20);
    CHECK(small == big);
    CHECK_EQ(kp_usable_size(small), (size_t)1 << 20);
    kp_free(small);
    CHECK(_kp_pageheap_is_valid());
}

/* A large block freed and allocated again at the same size reuses its span
 * (the page heap keeps a few whole); it is not kpool's live memory meanwhile. */
static void test_large_blocks_of_one_size_are_reused(void) {
    kp_set_error_handler(record_handler);
    char *a = kp_malloc((size_t)1 << 20);
    kp_free(a);
    CHECK(!kp_owns(a));
    CHECK_EQ(kp_usable_size(a), 0);
    handler_calls = 0;
    kp_free(a);                                 /* a double free of a kept span */
    CHECK_EQ(handler_calls, 1);
    CHECK(kp_realloc(a, 10) == NULL);
    CHECK_EQ(handler_calls, 2);
    char *b = kp_malloc((size_t)1 << 20);
    CHECK(b == a);
    CHECK(kp_owns(b + ((size_t)1 << 19)));
    CHECK(_kp_pageheap_is_valid());
    kp_free(b);
    kp_trim();                                  /* kept spans go back to the OS too */
    kp_stats st = { .struct_size = sizeof st };
    kp_stats_get(&st);
    CHECK_EQ(st.bytes_free_pageheap, 0);
    CHECK(_kp_pageheap_is_valid());
    kp_set_error_handler(NULL);
}

/* A process that lowers RLIMIT_AS after kpool started (a service calling
 * setrlimit, a sandbox, prlimit) keeps a working heap: kpool reserved no
 * large range of address space up front. In a child, so the limit stays
 * there. */
static void test_address_space_limit_set_after_start(void) {
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
    printf("     skipped: a sanitizer reserves terabytes of shadow memory\n");
    return;
#endif
    if (UNDER_VALGRIND()) {
        printf("     skipped: valgrind's shadow memory counts against RLIMIT_AS\n");
        return;
    }
    void *first = kp_malloc(100);
    CHECK(first != NULL);
    pid_t pid = fork();
    if (pid == 0) {
        struct rlimit lim = { (rlim_t)1 << 30, (rlim_t)1 << 30 };
        if (setrlimit(RLIMIT_AS, &lim) != 0) _exit(10);
        enum { MAX = 64 };
        void *blocks[MAX];
        size_t n = 0;
        while (n < MAX && (blocks[n] = kp_malloc((size_t)32 << 20)) != NULL) n++;
        if (n == MAX || errno != ENOMEM) _exit(11);        /* the limit stopped it, with ENOMEM */
        if (n < 16) _exit(12);                             /* over half the limit was usable */
        void *small = kp_malloc(100);                      /* small blocks still come */
        if (!small) _exit(13);
        kp_free(small);
        for (size_t i = 0; i < n; i++) kp_free(blocks[i]);
        size_t again = 0;                                  /* and freed memory serves again */
        while (again < n && (blocks[again] = kp_malloc((size_t)32 << 20)) != NULL) again++;
        if (again < n) _exit(14);
        for (size_t i = 0; i < again; i++) kp_free(blocks[i]);
        printf("     RLIMIT_AS 1 GiB: %zu blocks of 32 MiB, then ENOMEM; all again after freeing\n", n);
        fflush(stdout);
        _exit(0);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK_EQ(WEXITSTATUS(status), 0);
    kp_free(first);
}

static void handler_that_sets_errno(const char *call, const void *ptr, const char *what) {
    (void)call; (void)ptr; (void)what;
    errno = EIO;
}

static void test_free_keeps_errno(void) {
    enum { N = 3000 };
    static void *v[N];
    for (int i = 0; i < N; i++) v[i] = kp_malloc(i % 3 ? 48 : (size_t)(i % 7 + 1) * 300000);
    int changed = 0;
    for (int i = 0; i < N; i++) {   /* cache overflows to the central lists, large spans back to the page heap */
        errno = 4242;
        if (i % 2) kp_free(v[i]);
        else kp_free_sized(v[i], i % 3 ? 48 : (size_t)(i % 7 + 1) * 300000);
        changed += errno != 4242;
    }
    CHECK_EQ(changed, 0);
    /* a free that reaches the error handler: the handler's own calls (here
     * one that sets errno) do not leak out of kp_free */
    kp_error_handler old = kp_set_error_handler(handler_that_sets_errno);
    char *p = kp_malloc(100), *big = kp_malloc(400000);
    kp_free(p);
    kp_free(big);
    errno = 4244;
    kp_free(p);                       /* double free */
    CHECK_EQ(errno, 4244);
    kp_free(big);                     /* large double free */
    CHECK_EQ(errno, 4244);
    kp_free(&changed);                /* not kpool's */
    CHECK_EQ(errno, 4244);
    kp_set_error_handler(old);
}

/* kpool.h: the default handler prints "kpool: <call>(<address>): <what>"
 * and aborts. In a child, its stderr on a pipe. */
static void test_the_default_handler_prints_and_aborts(void) {
    int fds[2];
    CHECK_EQ(pipe(fds), 0);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        kp_set_error_handler(NULL);
        static int not_kpools;
        kp_free(&not_kpools);
        _exit(0);                                /* not reached */
    }
    close(fds[1]);
    char msg[512] = {0};
    size_t n = 0;
    ssize_t r;
    while (n < sizeof msg - 1 && (r = read(fds[0], msg + n, sizeof msg - 1 - n)) > 0) n += (size_t)r;
    close(fds[0]);
    int status = 0;
    CHECK_EQ(waitpid(pid, &status, 0), pid);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
    CHECK(strstr(msg, "kpool: kp_free(0x") == msg);
    CHECK(strstr(msg, "not allocated by kpool") != NULL);
}

static void other_handler(const char *call, const void *ptr, const char *what) {
    (void)call, (void)ptr, (void)what;
}

/* kp_set_error_handler returns the previous handler; NULL stands for the default. */
static void test_set_error_handler_returns_the_previous_one(void) {
    kp_error_handler was = kp_set_error_handler(record_handler);
    CHECK(kp_set_error_handler(other_handler) == record_handler);
    CHECK(kp_set_error_handler(NULL) == other_handler);
    CHECK(kp_set_error_handler(was) == NULL);
}

/* An arena block is not kp_free's or kp_realloc's: the handler, then
 * nothing (NULL and EINVAL for kp_realloc); the arena is untouched. */
static void test_arena_blocks_to_free_and_realloc_reach_the_handler(void) {
    kp_error_handler was = kp_set_error_handler(record_handler);
    kp_arena *arena = kp_arena_create(0);
    char *ab = kp_arena_alloc(arena, 100, 0);
    memset(ab, 5, 100);
    size_t used = kp_arena_used(arena);
    handler_calls = 0;
    kp_free(ab);
    CHECK_EQ(handler_calls, 1);
    CHECK(handler_ptr == ab);
    errno = 0;
    CHECK(kp_realloc(ab, 200) == NULL);
    CHECK_EQ(errno, EINVAL);
    CHECK_EQ(handler_calls, 2);
    CHECK(handler_call && strcmp(handler_call, "kp_realloc") == 0);
    CHECK(ab[0] == 5 && ab[99] == 5 && kp_arena_used(arena) == used);
    char *next = kp_arena_alloc(arena, 100, 0);
    CHECK(next && next != ab && (next >= ab + 100 || next + 100 <= ab));   /* ab is not handed out again */
    kp_arena_destroy(arena);
    kp_set_error_handler(was);
}

/* kpool.h: any power of two up to 1 GiB, for kp_aligned_alloc and arenas;
 * kp_arena_create(0) means 1 MiB chunks, other sizes round up to the page. */
static void test_one_gib_alignment_and_arena_chunk_sizes(void) {
    const size_t gib = (size_t)1 << 30;
    const size_t sizes[] = { 10, 300000 };
    for (int i = 0; i < 2; i++) {
        char *p = kp_aligned_alloc(gib, sizes[i]);
        CHECK(p && (uintptr_t)p % gib == 0 && kp_usable_size(p) >= sizes[i]);
        if (p) p[sizes[i] - 1] = 1;
        kp_free(p);
    }
    kp_arena *a = kp_arena_create(0);
    char *first = kp_arena_alloc(a, 10, 0);
    CHECK(first && kp_arena_reserved(a) == ((size_t)1 << 20));
    char *far = kp_arena_alloc(a, 10, gib);
    CHECK(far && (uintptr_t)far % gib == 0);
    errno = 0;
    CHECK(kp_arena_alloc(a, 10, gib * 2) == NULL);
    CHECK_EQ(errno, EINVAL);
    kp_arena_destroy(a);
    a = kp_arena_create(KP_PAGE_SIZE + 1);
    CHECK(kp_arena_alloc(a, 10, 0) != NULL);
    CHECK_EQ(kp_arena_reserved(a), 2 * KP_PAGE_SIZE);
    kp_arena_destroy(a);
}

int main(void) {
    RUN(test_free_keeps_errno);
    _kp_init();
    RUN(test_address_space_limit_set_after_start);   /* first: before the other tests map memory */
    RUN(test_malloc_zero_is_unique_and_freeable);
    RUN(test_alignment_of_every_class);
    RUN(test_calloc_overflow_and_huge_sizes);
    RUN(test_aligned_alloc);
    RUN(test_realloc);
    RUN(test_realloc_in_place_keeps_requested_bytes);
    RUN(test_usable_size_and_owns);
    RUN(test_misuse_reaches_the_handler);
    RUN(test_usable_size_rule);
    RUN(test_realloc_of_a_non_block_does_nothing);
    RUN(test_realloc_sized_misuse_is_realloc_misuse);
    RUN(test_large_double_free_has_its_own_message);
    RUN(test_debug_build_detects_small_block_misuse);
    RUN(test_map_failure_then_recovery);
    RUN(test_large_block_with_an_uncarved_span);
    RUN(test_fork_while_threads_allocate);
    RUN(test_memory_goes_back_without_trim);
    RUN(test_calloc_does_not_touch_zero_pages);
    RUN(test_realloc_grows_large_blocks_without_copying);
    RUN(test_large_blocks_of_one_size_are_reused);
    RUN(test_the_default_handler_prints_and_aborts);
    RUN(test_set_error_handler_returns_the_previous_one);
    RUN(test_arena_blocks_to_free_and_realloc_reach_the_handler);
    RUN(test_one_gib_alignment_and_arena_chunk_sizes);
    return DONE();
}
