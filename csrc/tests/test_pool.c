/* test_pool.c: fixed-size pools: bad arguments, alignment, exact capacity
 * across threads, misuse reaching the handler, trim and destroy. */
#include "check.h"
#include "kp_internal.h"

#include <signal.h>
#include <unistd.h>

static int handler_calls;
static void record_handler(const char *call, const void *ptr, const char *what) {
    handler_calls++;
    (void)call; (void)ptr; (void)what;
}

static void test_bad_arguments_are_einval(void) {
    errno = 0; CHECK(kp_pool_create(0, 16, 0) == NULL); CHECK_EQ(errno, EINVAL);
    errno = 0; CHECK(kp_pool_create(64, 48, 0) == NULL); CHECK_EQ(errno, EINVAL);
    errno = 0; CHECK(kp_pool_create(KP_POOL_MAX_BLOCK + 1, 16, 0) == NULL); CHECK_EQ(errno, EINVAL);
    errno = 0; CHECK(kp_pool_create(64, KP_POOL_MAX_ALIGN * 2, 0) == NULL); CHECK_EQ(errno, EINVAL);
    errno = 0; CHECK(kp_pool_alloc(NULL) == NULL); CHECK_EQ(errno, EINVAL);
    kp_pool_free(NULL, NULL);
    kp_pool_destroy(NULL);
    kp_pool *pool = kp_pool_create(64, 0, 0);
    kp_pool_stats st = { .struct_size = sizeof st };
    errno = 0; CHECK_EQ(kp_pool_stats_get(pool, NULL), -1); CHECK_EQ(errno, EINVAL);
    errno = 0; CHECK_EQ(kp_pool_stats_get(NULL, &st), -1); CHECK_EQ(errno, EINVAL);
    kp_pool_destroy(pool);
}

/* Out of memory: NULL with ENOMEM, and the pool works once memory is back. */
static void test_out_of_memory_is_enomem(void) {
    kp_trim();
    kp_pool *pool = kp_pool_create((size_t)64 << 20, 0, 0);
    CHECK(pool != NULL);
    _kp_os_fail_next(1000);
    errno = 0;
    void *b = kp_pool_alloc(pool);
    int e = errno;
    _kp_os_fail_next(0);
    CHECK(b == NULL);
    CHECK_EQ(e, ENOMEM);
    b = kp_pool_alloc(pool);
    CHECK(b != NULL);
    if (b) memset(b, 1, (size_t)64 << 20);
    kp_pool_free(pool, b);
    kp_pool_destroy(pool);
}

static void test_blocks_are_aligned_distinct_and_reused(void) {
    size_t aligns[] = { 0, 16, 64, 4096, 65536 };
    for (int a = 0; a < 5; a++) {
        kp_pool *pool = kp_pool_create(100, aligns[a], 0);
        CHECK(pool != NULL);
        size_t align = aligns[a] ? aligns[a] : 16;
        CHECK(kp_pool_block_size(pool) % align == 0 && kp_pool_block_size(pool) >= 100);
        enum { N = 300 };
        char *v[N];
        for (int i = 0; i < N; i++) {
            v[i] = kp_pool_alloc(pool);
            CHECK(v[i] && (uintptr_t)v[i] % align == 0);
            memset(v[i], i & 0xff, 100);
            CHECK(kp_owns(v[i]));
            CHECK(kp_pool_owns(pool, v[i]));
        }
        for (int i = 0; i < N; i++) CHECK(v[i][99] == (char)(i & 0xff));
        void *first = v[N - 1];
        kp_pool_free(pool, v[N - 1]);
        CHECK(kp_pool_alloc(pool) == first);     /* LIFO reuse */
        for (int i = 0; i < N; i++) kp_pool_free(pool, v[i]);
        kp_pool_stats st = { .struct_size = sizeof st };
        CHECK_EQ(kp_pool_stats_get(pool, &st), 0);
        CHECK_EQ(st.allocs, N + 1);
        CHECK_EQ(st.frees, N + 1);
        CHECK_EQ(st.live, 0);
        CHECK_EQ(st.misses, N);
        CHECK_EQ(st.hits, 1);
        CHECK(st.high_water >= 1);
        kp_pool_destroy(pool);
    }
}

static void test_bounded_pool_is_exact(void) {
    kp_pool *pool = kp_pool_create(32, 0, 10);
    void *v[10];
    for (int i = 0; i < 10; i++) CHECK((v[i] = kp_pool_alloc(pool)) != NULL);
    errno = 0;
    CHECK(kp_pool_alloc(pool) == NULL);
    CHECK_EQ(errno, ENOBUFS);
    kp_pool_free(pool, v[3]);
    CHECK(kp_pool_alloc(pool) == v[3]);
    kp_pool_stats st = { .struct_size = sizeof st };
    kp_pool_stats_get(pool, &st);
    CHECK_EQ(st.live, 10);
    CHECK_EQ(st.high_water, 10);
    CHECK_EQ(st.exhausted, 1);
    CHECK_EQ(st.capacity, 10);
    CHECK_EQ(st.capacity_waits, 0);
    kp_pool_note_wait(pool);                  /* a caller that waited once at capacity */
    kp_pool_note_wait(pool);
    kp_pool_stats_get(pool, &st);
    CHECK_EQ(st.capacity_waits, 2);
    CHECK_EQ(st.exhausted, 1);                /* a wait is not a refusal */
    for (int i = 0; i < 10; i++) kp_pool_free(pool, v[i]);
    kp_pool_destroy(pool);
}

typedef struct { kp_pool *pool; _Atomic int *live; _Atomic int *max_live; int cap; int failed; void **ring; _Atomic int *ring_pos; } cap_arg;

static void *cap_worker(void *arg) {
    cap_arg *a = arg;
    void *mine[8];
    int n = 0;
    for (int i = 0; i < 20000; i++) {
        if (n < 8) {
            void *p = kp_pool_alloc(a->pool);
            if (p) {
                int now = atomic_fetch_add(a->live, 1) + 1;
                if (now > a->cap) a->failed = 1;
                int m = atomic_load(a->max_live);
                while (now > m && !atomic_compare_exchange_weak(a->max_live, &m, now)) {}
                mine[n++] = p;
            }
        }
        if (n && (i % 3 == 0 || n == 8)) {
            atomic_fetch_sub(a->live, 1);
            kp_pool_free(a->pool, mine[--n]);
        }
    }
    while (n) { atomic_fetch_sub(a->live, 1); kp_pool_free(a->pool, mine[--n]); }
    return NULL;
}

static void test_capacity_is_never_exceeded_across_threads(void) {
    enum { T = 4, CAP = 12 };
    kp_pool *pool = kp_pool_create(64, 0, CAP);
    _Atomic int live = 0, max_live = 0;
    cap_arg args[T];
    pthread_t t[T];
    for (int i = 0; i < T; i++) {
        args[i] = (cap_arg){ .pool = pool, .live = &live, .max_live = &max_live, .cap = CAP };
        pthread_create(&t[i], NULL, cap_worker, &args[i]);
    }
    for (int i = 0; i < T; i++) { pthread_join(t[i], NULL); CHECK(!args[i].failed); }
    kp_pool_stats st = { .struct_size = sizeof st };
    kp_pool_stats_get(pool, &st);
    CHECK(st.high_water <= CAP);
    CHECK_EQ(st.live, 0);
    CHECK(st.misses <= CAP);
    kp_pool_destroy(pool);
}

typedef struct { kp_pool *pool; void **handoff; int n; } xarg;
static void *free_others(void *arg) {
    xarg *x = arg;
    for (int i = 0; i < x->n; i++) kp_pool_free(x->pool, x->handoff[i]);
    return NULL;
}

static void test_blocks_freed_by_other_threads_come_back(void) {
    kp_pool *pool = kp_pool_create(48, 0, 0);
    enum { N = 5000 };
    void **v = malloc(N * sizeof *v);
    for (int round = 0; round < 4; round++) {
        for (int i = 0; i < N; i++) v[i] = kp_pool_alloc(pool);
        xarg x = { pool, v, N };
        pthread_t t;
        pthread_create(&t, NULL, free_others, &x);
        pthread_join(t, NULL);   /* the exited thread's cache went back to the pool */
        kp_pool_stats st = { .struct_size = sizeof st };
        kp_pool_stats_get(pool, &st);
        CHECK_EQ(st.allocs, (uint64_t)(round + 1) * N);
        CHECK_EQ(st.frees, st.allocs);      /* every free counted once */
    }
    kp_pool_stats st = { .struct_size = sizeof st };
    kp_pool_stats_get(pool, &st);
    CHECK_EQ(st.live, 0);
    CHECK(st.misses <= N + 200);     /* later rounds reuse the first round's blocks */
    CHECK(st.hits >= 3 * N - 200);
    free(v);
    kp_pool_destroy(pool);
}

static void test_misuse_reaches_the_handler(void) {
    kp_set_error_handler(record_handler);
    kp_pool *a = kp_pool_create(64, 0, 0), *b = kp_pool_create(64, 0, 0), *c = kp_pool_create(64, 0, 5);
    char *pa = kp_pool_alloc(a);
    handler_calls = 0;
    kp_pool_free(b, pa);                 /* wrong pool */
    CHECK_EQ(handler_calls, 1);
    kp_pool_free(a, pa + 8);             /* interior pointer */
    CHECK_EQ(handler_calls, 2);
    int local;
    kp_pool_free(a, &local);             /* not kpool's */
    CHECK_EQ(handler_calls, 3);
    void *heap = kp_malloc(64);
    kp_pool_free(a, heap);               /* a heap block */
    CHECK_EQ(handler_calls, 4);
    kp_free(pa);                         /* a pool block given to kp_free */
    CHECK_EQ(handler_calls, 5);
    kp_pool_free(a, pa);
    kp_pool_free(a, pa);                 /* double free */
    CHECK_EQ(handler_calls, 6);
    void *pc = kp_pool_alloc(c);
    kp_pool_free(c, pc);
    kp_pool_free(c, pc);                 /* double free, bounded pool */
    CHECK_EQ(handler_calls, 7);
    kp_pool_stats st = { .struct_size = sizeof st };
    kp_pool_stats_get(a, &st);
    CHECK_EQ(st.live, 0);                /* the pool was not corrupted */
    CHECK(kp_pool_alloc(a) == pa);
    kp_free(heap);
    kp_pool_destroy(a);
    kp_pool_destroy(b);
    kp_pool_destroy(c);
    kp_set_error_handler(NULL);
}

/* The three ways a pool runs: cached (unbounded, a thread-cache slot),
 * locked because every slot is taken, and bounded (locked, exact capacity). */
enum { MODE_CACHED, MODE_LOCKED, MODE_BOUNDED, MODES };
static const char *mode_name[MODES] = { "cached", "locked (no slot left)", "bounded" };
static kp_pool *slot_hogs[KP_POOL_SLOTS];

static kp_pool *pool_in_mode(int mode, size_t block, size_t cap) {
    if (mode != MODE_LOCKED) return kp_pool_create(block, 0, mode == MODE_BOUNDED ? cap : 0);
    for (int i = 0; i < KP_POOL_SLOTS; i++) slot_hogs[i] = kp_pool_create(16, 0, 0);
    kp_pool *pool = kp_pool_create(block, 0, 0);
    for (int i = 0; i < KP_POOL_SLOTS; i++) kp_pool_destroy(slot_hogs[i]);
    return pool;
}

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "FAIL: a pool call did not return (a cyclic free list?)\n";
    if (write(2, msg, sizeof msg - 1) < 0) {}
    _exit(1);
}

static void *free_one(void *arg) {
    void **a = arg;
    kp_pool_free(a[0], a[1]);
    return NULL;
}

/* Frees that are not of a live block are reported and change nothing: a
 * double free that is not the last free (a, b, a), one ordered across
 * threads, and slots that were never handed out (the rest of this thread's
 * run, the uncarved rest of the chunk). Afterwards no block comes out twice,
 * a bounded pool's capacity is still exact, and owns/trim return. */
static void test_frees_of_blocks_that_are_not_live(void) {
    kp_set_error_handler(record_handler);
    signal(SIGALRM, on_alarm);
    alarm(20);
    for (int mode = 0; mode < MODES; mode++) {
        check_test = mode_name[mode];
        kp_pool *pool = pool_in_mode(mode, 64, 3);
        size_t bs = kp_pool_block_size(pool);
        char *a = kp_pool_alloc(pool), *b = kp_pool_alloc(pool);
        CHECK(a && b && a != b);
        handler_calls = 0;
        kp_pool_free(pool, a);
        kp_pool_free(pool, b);
        kp_pool_free(pool, a);                      /* a, b, a */
        CHECK_EQ(handler_calls, 1);
        CHECK_EQ(kp_pool_owns(pool, a), 0);         /* free blocks are not live */
        char *x = kp_pool_alloc(pool), *y = kp_pool_alloc(pool), *z = kp_pool_alloc(pool);
        CHECK(x && y && z && x != y && y != z && x != z);
        CHECK(kp_pool_owns(pool, x) && kp_pool_owns(pool, y) && kp_pool_owns(pool, z));
        if (mode == MODE_BOUNDED) {
            errno = 0;
            CHECK(kp_pool_alloc(pool) == NULL);     /* capacity 3, exact after misuse */
            CHECK_EQ(errno, ENOBUFS);
        }
        /* slots never handed out: the next ones after the newest block, and
         * the chunk's far end */
        char *newest = x > y ? (x > z ? x : z) : (y > z ? y : z);
        handler_calls = 0;
        kp_pool_free(pool, newest + bs);
        kp_pool_free(pool, newest + 2 * bs);
        kp_pool_free(pool, newest + 900 * bs);
        CHECK_EQ(handler_calls, 3);
        CHECK_EQ(kp_pool_owns(pool, newest + bs), 0);
        kp_pool_stats st = { .struct_size = sizeof st };
        CHECK_EQ(kp_pool_stats_get(pool, &st), 0);
        CHECK_EQ(st.live, 3);
        /* a double free ordered across threads */
        kp_pool_free(pool, x);
        void *args[2] = { pool, x };
        pthread_t t;
        handler_calls = 0;
        pthread_create(&t, NULL, free_one, args);
        pthread_join(t, NULL);
        CHECK_EQ(handler_calls, 1);
        kp_pool_free(pool, y);
        kp_pool_free(pool, z);
        CHECK_EQ(kp_pool_stats_get(pool, &st), 0);
        CHECK_EQ(st.live, 0);
        kp_pool_trim(pool);                         /* returns: the lists are intact */
        void *again[3];
        for (int i = 0; i < 3; i++) CHECK((again[i] = kp_pool_alloc(pool)) != NULL);
        CHECK(again[0] != again[1] && again[1] != again[2] && again[0] != again[2]);
        for (int i = 0; i < 3; i++) kp_pool_free(pool, again[i]);
        kp_pool_destroy(pool);
    }
    check_test = "test_frees_of_blocks_that_are_not_live";
    alarm(0);
    kp_set_error_handler(NULL);
}

enum { RING = 256 };
typedef struct {
    kp_pool *pool;
    void *ring[RING];
    _Atomic unsigned head, tail;
    _Atomic int done;
    int ops;
} stats_race;

static void *race_allocator(void *arg) {
    stats_race *r = arg;
    for (int i = 0; i < r->ops; i++) {
        void *p = kp_pool_alloc(r->pool);
        while (atomic_load(&r->head) - atomic_load(&r->tail) == RING) {}
        r->ring[atomic_load(&r->head) % RING] = p;
        atomic_fetch_add(&r->head, 1);
    }
    atomic_store(&r->done, 1);
    return NULL;
}

static void *race_freer(void *arg) {
    stats_race *r = arg;
    for (;;) {
        unsigned t = atomic_load(&r->tail);
        if (t == atomic_load(&r->head)) {
            if (atomic_load(&r->done) && t == atomic_load(&r->head)) break;
            continue;
        }
        kp_pool_free(r->pool, r->ring[t % RING]);
        atomic_store(&r->tail, t + 1);
    }
    return NULL;
}

/* Blocks allocated by one thread and freed by another while a third reads
 * the stats: live and high_water stay within what can be live (never a
 * wrapped negative, never above the blocks the chunks hold). */
static void test_stats_while_threads_allocate_and_free(void) {
    stats_race r = { .pool = kp_pool_create(64, 0, 0), .ops = 300000 };
    pthread_t a, f;
    pthread_create(&a, NULL, race_allocator, &r);
    pthread_create(&f, NULL, race_freer, &r);
    int bad = 0, reads = 0;
    while (!atomic_load(&r.done) || atomic_load(&r.tail) != atomic_load(&r.head)) {
        kp_pool_stats st = { .struct_size = sizeof st };
        kp_pool_stats_get(r.pool, &st);
        size_t can_live = st.bytes_mapped / st.block_size;
        if (st.live > can_live || st.high_water > can_live || st.live > st.allocs) bad++;
        reads++;
    }
    pthread_join(a, NULL);
    pthread_join(f, NULL);
    kp_pool_stats st = { .struct_size = sizeof st };
    kp_pool_stats_get(r.pool, &st);
    printf("     %d stats reads while %d blocks moved between threads; high water %zu\n", reads, r.ops, st.high_water);
    CHECK_EQ(bad, 0);
    CHECK(st.high_water <= st.bytes_mapped / st.block_size);
    kp_pool_destroy(r.pool);
}

static void test_trim_and_destroy_give_memory_back(void) {
    kp_stats before = { .struct_size = sizeof before }, after = { .struct_size = sizeof after };
    kp_stats_get(&before);
    kp_pool *pool = kp_pool_create(1000, 0, 0);
    enum { N = 4000 };
    void **v = malloc(N * sizeof *v);
    for (int i = 0; i < N; i++) v[i] = kp_pool_alloc(pool);
    kp_pool_stats st = { .struct_size = sizeof st };
    kp_pool_stats_get(pool, &st);
    CHECK(st.bytes_mapped >= (size_t)N * 1008);
    for (int i = 0; i < N; i++) kp_pool_free(pool, v[i]);
    size_t released = kp_pool_trim(pool);
    CHECK(released >= (size_t)N * 1000 / 2);
    kp_pool_stats_get(pool, &st);
    CHECK(st.bytes_mapped < (size_t)N * 1000 / 2);
    for (int i = 0; i < N; i++) v[i] = kp_pool_alloc(pool);   /* still works after trim */
    for (int i = 0; i < N; i++) CHECK(v[i] != NULL);
    kp_set_error_handler(record_handler);
    handler_calls = 0;
    kp_pool_destroy(pool);                                       /* with live blocks: all given back */
    CHECK_EQ(handler_calls, KP_DEBUG ? 1 : 0);                   /* a debug build reports them */
    kp_set_error_handler(NULL);
    kp_stats_get(&after);
    CHECK_EQ(after.bytes_pools, before.bytes_pools);
    free(v);
}

static void test_destroyed_pool_caches_are_not_reused(void) {
    for (int round = 0; round < 200; round++) {
        kp_pool *pool = kp_pool_create(64 + (size_t)(round % 5) * 16, 0, 0);
        void *p = kp_pool_alloc(pool);
        kp_pool_free(pool, p);          /* stays in this thread's cache */
        kp_pool_destroy(pool);
    }
    kp_pool *pool = kp_pool_create(64, 0, 0);
    void *p = kp_pool_alloc(pool);
    CHECK(p != NULL && kp_pool_owns(pool, p));
    kp_pool_free(pool, p);
    kp_pool_destroy(pool);
}

static void test_big_blocks_map_one_block_at_a_time(void) {
    kp_pool *pool = kp_pool_create((size_t)64 << 20, 0, 0);
    void *p = kp_pool_alloc(pool);
    CHECK(p != NULL);
    kp_pool_stats st = { .struct_size = sizeof st };
    kp_pool_stats_get(pool, &st);
    CHECK(st.bytes_mapped < ((size_t)65 << 20));     /* one 64 MiB block, not sixteen */
    kp_pool_free(pool, p);
    kp_pool_destroy(pool);
}

/* Cached pools of blocks up to a quarter of KP_POOL_CHUNK_ALIGNED (1 MiB)
 * get aligned chunks whose pages carry the pool's slot tag: their frees
 * take the fast path (one class byte, a mask, a multiply). Larger blocks are
 * found through their span. Either way a double free is reported. */
static void test_big_blocks_take_the_fast_path(void) {
    size_t sizes[] = { 64, 4096, 65536, (size_t)256 << 10, (size_t)1 << 20, (size_t)2 << 20 };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        kp_pool *pool = kp_pool_create(sizes[i], 0, 0);
        CHECK(pool != NULL);
        void *v[6];
        for (int j = 0; j < 6; j++) v[j] = kp_pool_alloc(pool);
        for (int j = 0; j < 6; j++) {
            CHECK(v[j] != NULL);
            unsigned tag = _kp_pagemap_class(v[j]);
            int slot_tag = tag >= KP_CLASS_POOL_SLOT0 && tag < KP_CLASS_POOL_SLOT0 + KP_POOL_SLOTS;
            CHECK_EQ(slot_tag, sizes[i] * 4 <= KP_POOL_CHUNK_ALIGNED);
            CHECK_EQ(kp_usable_size(v[j]), sizes[i]);
        }
        for (int j = 0; j < 6; j++) kp_pool_free(pool, v[j]);
        handler_calls = 0;
        kp_set_error_handler(record_handler);
        kp_pool_free(pool, v[2]);               /* not live: reported, not cached twice */
        kp_set_error_handler(NULL);
        CHECK_EQ(handler_calls, 1);
        void *a = kp_pool_alloc(pool), *b = kp_pool_alloc(pool);
        CHECK(a != b);
        kp_pool_free(pool, a);
        kp_pool_free(pool, b);
        kp_pool_destroy(pool);
    }
}

/* A block handed out shows neither its encoded link nor its free marker
 * (the link's key is the heap's: an uninitialised read must not show it),
 * unbounded (a thread cache) and bounded (the shared stack). */
static void test_handed_out_block_shows_no_link(void) {
    for (int bounded = 0; bounded < 2; bounded++) {
        kp_pool *pool = kp_pool_create(64, 0, bounded ? 8 : 0);
        CHECK(pool != NULL);
        uintptr_t *a = kp_pool_alloc(pool), *b = kp_pool_alloc(pool), *c = kp_pool_alloc(pool);
        kp_pool_free(pool, c);
        kp_pool_free(pool, b);
        kp_pool_free(pool, a);
        uintptr_t *again[3];
        for (int i = 0; i < 3; i++) {
            uintptr_t *p = again[i] = kp_pool_alloc(pool);
            CHECK(p == a || p == b || p == c);
            uintptr_t w0 = p[0], w1 = p[1];
            KP_VG_DEFINED_VALUE(w0);   /* memcheck: a new block is undefined; the test reads its bytes anyway */
            KP_VG_DEFINED_VALUE(w1);
            CHECK_EQ(w0, 0);
            CHECK_EQ(w1, 0);
        }
        for (int i = 0; i < 3; i++) kp_pool_free(pool, again[i]);   /* a KP_DEBUG build reports live blocks at destroy */
        kp_pool_destroy(pool);
    }
}

/* free_blocks: carved and not live; a caller of the first layout (no
 * free_blocks) is served, and nothing past its struct_size is written. */
static void test_free_blocks_and_the_first_stats_layout(void) {
    kp_pool *pool = kp_pool_create(64, 0, 0);
    void *v[100];
    for (int i = 0; i < 100; i++) v[i] = kp_pool_alloc(pool);
    for (int i = 0; i < 50; i++) kp_pool_free(pool, v[i]);
    kp_pool_stats st = { .struct_size = sizeof st };
    CHECK_EQ(kp_pool_stats_get(pool, &st), 0);
    CHECK_EQ(st.live, 50);
    CHECK(st.free_blocks >= 50 && st.free_blocks + st.live <= st.chunks * (st.bytes_mapped / st.chunks) / 64);
    kp_pool_stats old = { .struct_size = offsetof(kp_pool_stats, free_blocks), .free_blocks = 12345 };
    CHECK_EQ(kp_pool_stats_get(pool, &old), 0);
    CHECK(old.live == 50 && old.chunks == st.chunks && old.free_blocks == 12345);
    kp_pool_stats tiny = { .struct_size = offsetof(kp_pool_stats, free_blocks) - 1 };
    errno = 0;
    CHECK_EQ(kp_pool_stats_get(pool, &tiny), -1);
    CHECK_EQ(errno, EINVAL);
    for (int i = 50; i < 100; i++) kp_pool_free(pool, v[i]);
    kp_pool_trim(pool);
    CHECK_EQ(kp_pool_stats_get(pool, &st), 0);
    CHECK(st.chunks == 0 && st.free_blocks == 0);
    kp_pool_destroy(pool);
}

int main(void) {
    _kp_init();
    RUN(test_bad_arguments_are_einval);
    RUN(test_out_of_memory_is_enomem);
    RUN(test_big_blocks_map_one_block_at_a_time);
    RUN(test_blocks_are_aligned_distinct_and_reused);
    RUN(test_bounded_pool_is_exact);
    RUN(test_capacity_is_never_exceeded_across_threads);
    RUN(test_blocks_freed_by_other_threads_come_back);
    RUN(test_misuse_reaches_the_handler);
    RUN(test_frees_of_blocks_that_are_not_live);
    RUN(test_stats_while_threads_allocate_and_free);
    RUN(test_trim_and_destroy_give_memory_back);
    RUN(test_destroyed_pool_caches_are_not_reused);
    RUN(test_big_blocks_take_the_fast_path);
    RUN(test_handed_out_block_shows_no_link);
    RUN(test_free_blocks_and_the_first_stats_layout);
    return DONE();
}
