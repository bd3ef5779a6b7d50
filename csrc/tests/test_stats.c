/* test_stats.c: every figure of kp_stats moves the way it should: counts,
 * gauges, reset, lock contention, fragmentation, the accounting identity. */
#include "check.h"
#include "kp_internal.h"

#include <sys/wait.h>
#include <unistd.h>

static kp_stats snap(void) {
    kp_stats st = { .struct_size = sizeof st };
    CHECK_EQ(kp_stats_get(&st), 0);
    return st;
}

static void test_versioned_struct(void) {
    kp_stats st = { .struct_size = 8 };
    errno = 0;
    CHECK_EQ(kp_stats_get(&st), -1);
    CHECK_EQ(errno, EINVAL);
    CHECK_EQ(kp_stats_get(NULL), -1);
    /* an older caller that knows only the part before the class table */
    kp_stats *small = calloc(1, sizeof *small);
    small->struct_size = offsetof(kp_stats, classes);
    small->classes[0].size = 12345;
    CHECK_EQ(kp_stats_get(small), 0);
    CHECK_EQ(small->version, KP_STATS_VERSION);
    CHECK_EQ(small->classes[0].size, 12345);    /* not written past struct_size */
    CHECK_EQ(small->nclasses, 0);               /* ... and it says it holds no rows */
    /* a struct that ends inside row 3: rows 0-2 written, nclasses 3 */
    small->struct_size = offsetof(kp_stats, classes) + 3 * sizeof(kp_class_stats) + 8;
    small->classes[3].in_use = 12345;
    CHECK_EQ(kp_stats_get(small), 0);
    CHECK_EQ(small->nclasses, 3);
    CHECK(small->classes[0].size == 16 && small->classes[2].size > small->classes[1].size);
    CHECK_EQ(small->classes[3].in_use, 12345);   /* past struct_size: untouched */
    free(small);
    kp_stats full = snap();
    CHECK_EQ(full.nclasses, KP_NUM_CLASSES - 1);
    CHECK_EQ(full.classes[0].size, 16);
}

static void test_counts_and_gauges(void) {
    enum { N = 1000 };
    void *v[N];
    kp_stats a = snap();
    unsigned cls = _kp_size_class(200);
    for (int i = 0; i < N; i++) v[i] = kp_malloc(200);
    kp_stats b = snap();
    CHECK(b.allocs >= a.allocs + N);
    CHECK(b.classes[cls - 1].allocs >= a.classes[cls - 1].allocs + N);
    CHECK(b.bytes_in_use >= a.bytes_in_use + N * 200);
    CHECK(b.classes[cls - 1].in_use >= N);
    CHECK(b.bytes_requested >= a.bytes_requested + N * 200);
    for (int i = 0; i < N; i++) kp_free_sized(v[i], 200);
    kp_stats c = snap();
    CHECK(c.frees >= b.frees + N);
    CHECK_EQ(c.classes[cls - 1].in_use, a.classes[cls - 1].in_use);
    CHECK_EQ(c.bytes_requested, a.bytes_requested);
    kp_thread_flush();
    kp_stats d = snap();
    CHECK_EQ(d.classes[cls - 1].free_in_tcaches, 0);
    CHECK(d.central_returns > c.central_returns);
    void *big = kp_malloc(5 << 20);
    kp_stats e = snap();
    CHECK(e.bytes_in_use >= d.bytes_in_use + (5 << 20));
    CHECK(e.large_allocs >= d.large_allocs + 1);
    kp_free(big);
}

static pthread_key_t late_key;
/* Runs after kpool's own key destructor (keys are destroyed in the order
 * they were made): the thread's cache is gone. */
static void late_destructor(void *p) { kp_free(p); }
static void *thread_frees_after_its_cache_is_gone(void *arg) {
    (void)arg;
    pthread_setspecific(late_key, kp_malloc(40));
    return NULL;
}

/* In a child, so that the rest of this program keeps exact figures. */
static void test_unsized_free_without_a_cache_is_an_estimate(void) {
    pid_t pid = fork();
    if (pid == 0) {
        kp_stats a = snap();
        if (a.requested_exact != 1 || a.tcaches_unavailable != 0) _exit(10);   /* every free so far told its size */
        if (pthread_key_create(&late_key, late_destructor) != 0) _exit(11);    /* made after kpool's key */
        pthread_t t;
        pthread_create(&t, NULL, thread_frees_after_its_cache_is_gone, NULL);
        pthread_join(t, NULL);
        kp_stats b = snap();
        if (b.requested_exact != 0) _exit(12);
        if (b.uncached_ops < a.uncached_ops + 1) _exit(13);
        _exit(check_failed ? 14 : 0);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK_EQ(WEXITSTATUS(status), 0);
}

/* The pagemap's leaves are kpool's bookkeeping too. */
static void test_metadata_counts_the_pagemap(void) {
    void *p = kp_malloc(100);
    kp_stats s = snap();
    CHECK(s.bytes_metadata >= sizeof(kp_pagemap_leaf));
    CHECK(s.bytes_metadata >= _kp_meta_bytes() + _kp_pagemap_bytes());
    kp_free_sized(p, 100);
}

enum { RING = 512 };
typedef struct {
    void *ring[RING];
    size_t size[RING];
    _Atomic unsigned head, tail;
    _Atomic int done;
} heap_race;

static void *race_alloc(void *arg) {
    heap_race *r = arg;
    for (int i = 0; i < 400000; i++) {
        size_t n = 16 + (size_t)(i % 7) * 48;
        void *p = kp_malloc(n);
        while (atomic_load(&r->head) - atomic_load(&r->tail) == RING) {}
        r->ring[atomic_load(&r->head) % RING] = p;
        r->size[atomic_load(&r->head) % RING] = n;
        atomic_fetch_add(&r->head, 1);
    }
    atomic_store(&r->done, 1);
    return NULL;
}

static void *race_free(void *arg) {
    heap_race *r = arg;
    for (;;) {
        unsigned t = atomic_load(&r->tail);
        if (t == atomic_load(&r->head)) {
            if (atomic_load(&r->done) && t == atomic_load(&r->head)) break;
            continue;
        }
        kp_free_sized(r->ring[t % RING], r->size[t % RING]);   /* sized: the figures stay exact */
        atomic_store(&r->tail, t + 1);
    }
    return NULL;
}

/* A reader beside a thread that allocates and one that frees what it
 * allocated: no figure wraps or exceeds what can be live. */
static void test_stats_read_while_threads_move_blocks(void) {
    static heap_race r;
    pthread_t a, f;
    pthread_create(&a, NULL, race_alloc, &r);
    pthread_create(&f, NULL, race_free, &r);
    int bad = 0, reads = 0;
    while (!atomic_load(&r.done) || atomic_load(&r.tail) != atomic_load(&r.head)) {
        kp_stats s = snap();
        size_t small_live = 0;
        for (size_t k = 0; k < s.nclasses; k++) {
            if (s.classes[k].in_use > s.classes[k].spans * _kp_classes[k + 1].objects) bad++;
            small_live += s.classes[k].in_use * s.classes[k].size;
        }
        if (small_live > s.bytes_small_spans || s.bytes_requested > s.bytes_in_use) bad++;
        reads++;
    }
    pthread_join(a, NULL);
    pthread_join(f, NULL);
    printf("     %d reads while 400000 blocks moved between two threads\n", reads);
    CHECK_EQ(bad, 0);
}

static void test_requested_and_internal_fragmentation(void) {
    kp_stats a = snap();
    CHECK_EQ(a.requested_exact, 1);     /* every free so far told its size */
    void *v[100];
    for (int i = 0; i < 100; i++) v[i] = kp_malloc(17);     /* class 32: half wasted */
    kp_stats b = snap();
    CHECK_EQ(b.bytes_requested - a.bytes_requested, 1700);
    CHECK_EQ(b.bytes_in_use - a.bytes_in_use, 3200);
    CHECK(b.internal_fragmentation > a.internal_fragmentation || b.internal_fragmentation > 0.3);
    for (int i = 0; i < 100; i++) kp_free_sized(v[i], 17);
    kp_stats c = snap();
    CHECK(c.requested_exact == a.requested_exact);
    void *p = kp_malloc(17);
    kp_free(p);                                              /* size not told */
    kp_stats d = snap();
    CHECK_EQ(d.requested_exact, 0);
}

static void test_reset_zeroes_events_not_gauges(void) {
    void *keep = kp_malloc(5000);
    kp_stats_reset();
    kp_stats a = snap();
    CHECK_EQ(a.allocs, 0);
    CHECK_EQ(a.frees, 0);
    CHECK(a.lock_acquires <= 4);          /* reading the stats takes a few locks itself */
    CHECK(a.bytes_in_use >= 5000);
    void *p = kp_malloc(64);
    kp_free(p);
    kp_stats b = snap();
    CHECK_EQ(b.allocs, 1);
    CHECK_EQ(b.frees, 1);
    kp_free(keep);
}

static void *hammer(void *arg) {
    (void)arg;
    void *v[64];
    for (int r = 0; r < 3000; r++) {
        for (int i = 0; i < 64; i++) v[i] = kp_malloc(4000);
        for (int i = 0; i < 64; i++) kp_free(v[i]);
        kp_thread_flush();              /* force every batch through the central lock */
    }
    return NULL;
}

static void test_lock_contention_is_counted(void) {
    kp_stats a = snap();
    pthread_t t[4];
    for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, hammer, NULL);
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    kp_stats b = snap();
    CHECK(b.lock_acquires > a.lock_acquires + 4 * 3000);
    CHECK(b.lock_contended > a.lock_contended);
    CHECK(b.lock_wait_ns > a.lock_wait_ns);
    printf("     locks: %llu acquired, %llu contended, %llu ns waiting\n",
           (unsigned long long)(b.lock_acquires - a.lock_acquires),
           (unsigned long long)(b.lock_contended - a.lock_contended),
           (unsigned long long)(b.lock_wait_ns - a.lock_wait_ns));
}

static void test_external_fragmentation(void) {
    enum { N = 20000 };
    void **v = malloc(N * sizeof *v);
    /* not fragmenting: allocate, free all */
    for (int i = 0; i < N; i++) v[i] = kp_malloc(128);
    for (int i = 0; i < N; i++) kp_free(v[i]);
    kp_thread_flush();
    kp_stats calm = snap();
    /* fragmenting: free every other block */
    for (int i = 0; i < N; i++) v[i] = kp_malloc(128);
    for (int i = 0; i < N; i += 2) kp_free(v[i]);
    kp_trim();          /* only the holes are left: no free spans to serve a large request */
    kp_stats frag = snap();
    printf("     external fragmentation: calm %.3f, every other block freed %.3f\n",
           calm.external_fragmentation, frag.external_fragmentation);
    CHECK(frag.external_fragmentation > calm.external_fragmentation);
    CHECK(frag.external_fragmentation > 0.9);
    CHECK(frag.bytes_free_central >= (size_t)N / 2 * 128);
    for (int i = 1; i < N; i += 2) kp_free(v[i]);
    free(v);
}

static void test_bytes_mapped_is_accounted_for(void) {
    kp_pool *pool = kp_pool_create(256, 0, 0);
    void *pb = kp_pool_alloc(pool);
    kp_arena *ar = kp_arena_create(0);
    kp_arena_alloc(ar, 100, 16);
    void *big = kp_malloc(1 << 20);
    kp_stats s = snap();
    size_t sum = s.bytes_small_spans + s.bytes_meshed + s.bytes_large + s.bytes_pools + s.bytes_arenas + s.bytes_free_pageheap +
                 s.bytes_released;
    CHECK_EQ(sum, s.bytes_mapped);
    CHECK(s.bytes_pools > 0 && s.bytes_arenas > 0 && s.bytes_large >= (1 << 20));
    size_t small_live = 0;
    for (size_t k = 0; k < s.nclasses; k++) small_live += s.classes[k].in_use * s.classes[k].size;
    CHECK_EQ(small_live + s.bytes_free_tcaches + s.bytes_free_central + s.bytes_span_waste, s.bytes_small_spans);
    kp_free(big);
    kp_pool_free(pool, pb);
    kp_pool_destroy(pool);
    kp_arena_destroy(ar);
}

static void test_print(void) {
    FILE *f = tmpfile();
    kp_stats_print(f);
    long n = ftell(f);
    CHECK(n > 200);
    rewind(f);
    char line[256];
    CHECK(fgets(line, sizeof line, f) && strstr(line, "kpool"));
    fclose(f);
}

/* kpool.h: kp_realloc_sized keeps bytes_requested exact (kept in place,
 * moved, to 0); kp_realloc of a small block makes it an estimate. In a child. */
static void test_realloc_sized_keeps_requested_exact(void) {
    pid_t pid = fork();
    if (pid == 0) {
        kp_stats a = snap();
        if (a.requested_exact != 1) _exit(10);
        char *p = kp_malloc(40);
        char *q = kp_realloc_sized(p, 40, 44);       /* kept: the 48-byte class */
        char *r = kp_realloc_sized(q, 44, 500);      /* moved to another class */
        char *big = kp_realloc_sized(kp_malloc(100), 100, 300000);   /* small to large */
        kp_stats b = snap();
        if (q != p || r == q || !big) _exit(11);
        if (b.requested_exact != 1) _exit(12);
        if (b.bytes_requested - a.bytes_requested != 500 + 300000) _exit(13);
        char *z = kp_realloc_sized(r, 500, 0);       /* freed: the unique pointer of size 0 */
        kp_free_sized(z, 0);
        kp_free_sized(big, 300000);
        kp_stats c = snap();
        if (c.requested_exact != 1 || c.bytes_requested != a.bytes_requested) _exit(14);
        char *u = kp_realloc(kp_malloc(40), 44);     /* untold: an estimate from now on */
        kp_free_sized(u, 44);
        if (snap().requested_exact != 0) _exit(15);
        _exit(0);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK_EQ(WEXITSTATUS(status), 0);
}

/* kpool.h: enabled is 0 when the library was built without counters; the
 * figures kpool keeps anyway (the page heap's) are still there. */
static void test_enabled_says_whether_the_counters_are_built(void) {
    kp_stats st = { .struct_size = sizeof st };
    void *p[100];
    for (int i = 0; i < 100; i++) p[i] = kp_malloc(64);
    CHECK_EQ(kp_stats_get(&st), 0);
    CHECK_EQ(st.enabled, KP_STATS ? 1 : 0);
    CHECK(st.bytes_mapped > 0);
    if (KP_STATS) CHECK(st.allocs >= 100);
    else CHECK_EQ(st.allocs, 0);
    for (int i = 0; i < 100; i++) kp_free_sized(p[i], 64);   /* bytes_requested stays exact */
}

int main(void) {
    _kp_init();
    RUN(test_enabled_says_whether_the_counters_are_built);
    if (!KP_STATS) return DONE();   /* `make nostats`: the rest needs the counters */
    RUN(test_versioned_struct);
    RUN(test_counts_and_gauges);
    RUN(test_unsized_free_without_a_cache_is_an_estimate);
    RUN(test_realloc_sized_keeps_requested_exact);
    RUN(test_metadata_counts_the_pagemap);
    RUN(test_stats_read_while_threads_move_blocks);
    RUN(test_requested_and_internal_fragmentation);
    RUN(test_reset_zeroes_events_not_gauges);
    RUN(test_lock_contention_is_counted);
    RUN(test_external_fragmentation);
    RUN(test_bytes_mapped_is_accounted_for);
    RUN(test_print);
    return DONE();
}
