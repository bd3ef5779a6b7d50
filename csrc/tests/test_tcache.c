/* test_tcache.c: per-thread caches: refill/flush in batches, the byte cap,
 * kp_thread_flush, and everything going back when threads exit (also
 * threads that never call kpool at exit). */
#include "check.h"
#include "kp_internal.h"

static size_t cached_in_all_threads(unsigned cls) {
    kp_stats st = { .struct_size = sizeof st };
    kp_stats_get(&st);
    return st.classes[cls - 1].free_in_tcaches;
}

/* n blocks of size, all live at once, then all freed (n <= 128). */
static void alloc_then_free(size_t size, int n) {
    void *v[128];
    for (int i = 0; i < n; i++) v[i] = kp_malloc(size);
    for (int i = 0; i < n; i++) kp_free(v[i]);
}

/* A new thread's list starts small and doubles per refill up to a whole
 * batch (slow start: a class a thread uses once does not make a batch of
 * blocks resident), then moves whole batches. */
/* Runs in a new thread; records only (the CHECKs run in the main thread:
 * check.h's counters are not atomic). sizes[8] = the list's max at start,
 * sizes[9] = 1 if the thread had a cache. */
static void *refill_sizes(void *arg) {
    unsigned cls = _kp_size_class(80), *sizes = arg;
    kp_tcache *tc = _kp_tcache_get();
    sizes[9] = tc != NULL;
    if (!tc) return NULL;
    sizes[8] = tc->lists[cls].max;
    enum { N = 200 };
    void *v[N];
    unsigned refills = 0;
    uint64_t fetched = KP_LOAD(tc->moves[cls].fetched);
    for (int i = 0; i < N && refills < 8; i++) {
        v[i] = kp_malloc(80);
        uint64_t now = KP_LOAD(tc->moves[cls].fetched);
        if (now != fetched) sizes[refills++] = (unsigned)(now - fetched);
        fetched = now;
        if (refills == 8) for (int j = 0; j <= i; j++) kp_free(v[j]);
    }
    return NULL;
}

static void test_refill_and_overflow_move_batches(void) {
    unsigned cls = _kp_size_class(80), batch = _kp_classes[cls].batch;
    CHECK_EQ(batch, 32);
    unsigned sizes[10] = { 0 };
    pthread_t t;
    int created = pthread_create(&t, NULL, refill_sizes, sizes);
    if (created == 0) pthread_join(t, NULL);
    CHECK_EQ(created, 0);
    CHECK_EQ(sizes[9], 1);
    CHECK_EQ(sizes[8], 0);
    unsigned want[8] = { 2, 3, 5, 9, 17, 32, 32, 32 };
    for (int i = 0; i < 8; i++) CHECK_EQ(sizes[i], want[i]);
    kp_tcache *tc = _kp_tcache_get();
    CHECK(tc != NULL);
    alloc_then_free(80, 128);
    kp_thread_flush();
    CHECK_EQ(KP_LOAD(tc->lists[cls].count), 0);
    void *p = kp_malloc(80);
    CHECK(tc->lists[cls].max >= batch);    /* a list grown before keeps its max */
    CHECK_EQ(KP_LOAD(tc->lists[cls].count), batch - 1);
    kp_free(p);
    enum { N = 1000 };
    void *v[N];
    for (int i = 0; i < N; i++) v[i] = kp_malloc(80);
    for (int i = 0; i < N; i++) kp_free(v[i]);
    CHECK(KP_LOAD(tc->lists[cls].count) <= tc->lists[cls].max);
    CHECK(_kp_central_is_valid(cls));
}


/* Frees alone grow a list to its class's tcache_free_max; refills (a thread
 * allocating what it freed) grow it on to tcache_max. Runs in a new thread
 * (a fresh cache); records only: out[0] = the max after freeing blocks
 * another thread made, out[1] = the max and out[2] = the count after
 * rounds of allocating and freeing them all, out[3] = 1 if it had a cache. */
enum { GROW_N = 3000 };
static void *free_then_churn(void *arg) {
    void **v = arg;
    unsigned *out = (unsigned *)(v + GROW_N), cls = _kp_size_class(48);
    kp_tcache *tc = _kp_tcache_get();
    out[3] = tc != NULL;
    if (!tc) return NULL;
    for (int i = 0; i < GROW_N; i++) kp_free(v[i]);
    out[0] = tc->lists[cls].max;
    for (int round = 0; round < 4; round++) {
        for (int i = 0; i < GROW_N; i++) v[i] = kp_malloc(48);
        for (int i = 0; i < GROW_N; i++) kp_free(v[i]);
    }
    out[1] = tc->lists[cls].max;
    out[2] = KP_LOAD(tc->lists[cls].count);
    return NULL;
}

static void test_refills_grow_a_list_past_what_frees_reach(void) {
    unsigned cls = _kp_size_class(48);
    const kp_class_info *ci = &_kp_classes[cls];
    CHECK(ci->tcache_free_max < ci->tcache_max);
    CHECK((size_t)ci->tcache_max * ci->size <= KP_TCACHE_MAX_BYTES);   /* the budget allows the whole list */
    void **v = malloc(GROW_N * sizeof *v + 4 * sizeof(unsigned));
    CHECK(v != NULL);
    if (!v) return;
    unsigned *out = (unsigned *)(v + GROW_N);
    memset(out, 0, 4 * sizeof *out);
    for (int i = 0; i < GROW_N; i++) v[i] = kp_malloc(48);
    pthread_t t;
    int created = pthread_create(&t, NULL, free_then_churn, v);
    if (created == 0) pthread_join(t, NULL);
    CHECK_EQ(created, 0);
    CHECK_EQ(out[3], 1);
    CHECK(out[0] <= ci->tcache_free_max);   /* a consumer keeps a few batches */
    CHECK(out[1] > ci->tcache_free_max);    /* a thread that allocates them again holds more */
    CHECK(out[1] <= ci->tcache_max);
    CHECK(out[2] > ci->tcache_free_max);
    CHECK(_kp_central_is_valid(cls));
    free(v);
}

/* Bytes of free blocks in tc's lists. */
static size_t held_bytes(const kp_tcache *tc) {
    size_t held = 0;
    for (unsigned c = 1; c < KP_NUM_CLASSES; c++) held += (size_t)KP_LOAD(tc->lists[c].count) * _kp_classes[c].size;
    return held;
}

static void test_byte_cap(void) {
    kp_tcache *tc = _kp_tcache_get();
    for (int s = 0; s < 6; s++) {
        size_t size = (size_t)(32 << 10) << s;
        if (size > KP_SMALL_MAX) break;
        alloc_then_free(size, 64);
        size_t held = held_bytes(tc), budget = 0;
        for (unsigned c = 1; c < KP_NUM_CLASSES; c++) {
            budget += (size_t)tc->lists[c].max * _kp_classes[c].size;
            CHECK(KP_LOAD(tc->lists[c].count) <= tc->lists[c].max);
            CHECK(tc->lists[c].max <= _kp_classes[c].tcache_max);
        }
        CHECK(held <= KP_TCACHE_MAX_BYTES);
        CHECK_EQ(budget, tc->budget_used);
        CHECK(budget <= KP_TCACHE_MAX_BYTES);
    }
}

/* Many live threads share KP_TCACHE_TOTAL_BYTES: each one's lists stay
 * within its share once it has overflowed a few times. */
enum { MANY_THREADS = 80 };
static pthread_barrier_t share_barrier;
static _Atomic int share_failures;

/* 1 if some list of tc may hold more than its class's tcache_max. */
static int over_class_max(const kp_tcache *tc) {
    for (unsigned c = 1; c < KP_NUM_CLASSES; c++)
        if (tc->lists[c].max > _kp_classes[c].tcache_max) return 1;
    return 0;
}

/* Lists of large classes grow and take budget from each other (partial
 * shrinks included); 1 if a list ever went over its class's tcache_max. */
static int churn_large_blocks(void) {
    enum { N = 64 };
    void *v[N];
    kp_tcache *tc = _kp_tcache_get();
    int over = 0;
    for (int round = 0; round < 4; round++)
        for (size_t size = 4096; size <= KP_SMALL_MAX; size += size / 2) {
            for (int i = 0; i < N; i++) v[i] = kp_malloc(size);
            for (int i = 0; i < N; i++) {
                kp_free(v[i]);
                over |= over_class_max(tc);
            }
        }
    return over;
}

static void *use_a_share(void *arg) {
    (void)arg;
    kp_tcache *tc = _kp_tcache_get();
    pthread_barrier_wait(&share_barrier);      /* every cache is live now */
    int over = churn_large_blocks();
    size_t cap = _kp_tcache_budget_cap();
    if (cap != KP_TCACHE_MIN_BYTES || tc->budget_used > cap || held_bytes(tc) > cap || over)
        atomic_fetch_add(&share_failures, 1);
    pthread_barrier_wait(&share_barrier);      /* no cache leaves before all have checked */
    return NULL;
}

static void test_budget_is_shared_among_threads(void) {
    _Static_assert(KP_TCACHE_TOTAL_BYTES / (MANY_THREADS + 1) <= KP_TCACHE_MIN_BYTES, "enough threads to reach the floor");
    /* Alone, this thread fills a larger share; when the others start it is
     * over its new share, and its overflows give budget back. */
    CHECK(_kp_tcache_budget_cap() > KP_TCACHE_MIN_BYTES);
    CHECK(!churn_large_blocks());
    CHECK(_kp_tcache_get()->budget_used > KP_TCACHE_MIN_BYTES);
    pthread_barrier_init(&share_barrier, NULL, MANY_THREADS + 1);
    pthread_t t[MANY_THREADS];
    for (int i = 0; i < MANY_THREADS; i++) CHECK_EQ(pthread_create(&t[i], NULL, use_a_share, NULL), 0);
    use_a_share(NULL);
    for (int i = 0; i < MANY_THREADS; i++) pthread_join(t[i], NULL);
    pthread_barrier_destroy(&share_barrier);
    CHECK_EQ(atomic_load(&share_failures), 0);
}

/* A cache that filled a large share before other threads made theirs (so it
 * never had to take budget from a list, and its round-robin cursor still
 * points at class 0) is over its share once they start; its overflows give
 * the excess back. (This once divided by class 0's size of 0.) */
static pthread_barrier_t warm_barrier, live_barrier;
static size_t late_before, late_after, late_cap;

static void *fill_alone_then_give_back(void *arg) {
    (void)arg;
    kp_tcache *tc = _kp_tcache_get();
    alloc_then_free(4096, 64);
    alloc_then_free(6144, 64);
    alloc_then_free(9216, 64);
    late_before = tc->budget_used;
    pthread_barrier_wait(&warm_barrier);      /* now the others start */
    pthread_barrier_wait(&live_barrier);      /* their caches are live */
    for (int round = 0; round < 64; round++) alloc_then_free(4096, 128);   /* more than the list holds: each round overflows */
    late_cap = _kp_tcache_budget_cap();
    late_after = tc->budget_used;
    pthread_barrier_wait(&live_barrier);      /* they stay until this is measured */
    return NULL;
}

static void *hold_a_cache(void *arg) {
    (void)arg;
    (void)_kp_tcache_get();
    pthread_barrier_wait(&live_barrier);
    pthread_barrier_wait(&live_barrier);
    return NULL;
}

static void test_cache_over_its_share_gives_back(void) {
    pthread_barrier_init(&warm_barrier, NULL, 2);
    pthread_barrier_init(&live_barrier, NULL, MANY_THREADS + 1);
    pthread_t late, t[MANY_THREADS];
    CHECK_EQ(pthread_create(&late, NULL, fill_alone_then_give_back, NULL), 0);
    pthread_barrier_wait(&warm_barrier);
    for (int i = 0; i < MANY_THREADS; i++) CHECK_EQ(pthread_create(&t[i], NULL, hold_a_cache, NULL), 0);
    pthread_join(late, NULL);
    for (int i = 0; i < MANY_THREADS; i++) pthread_join(t[i], NULL);
    pthread_barrier_destroy(&warm_barrier);
    pthread_barrier_destroy(&live_barrier);
    CHECK(late_before > KP_TCACHE_MIN_BYTES);   /* it was over the share it got later */
    CHECK_EQ(late_cap, KP_TCACHE_MIN_BYTES);
    CHECK(late_after <= late_cap);
}

/* One live cache gets KP_TCACHE_SOLO_BYTES; with a second thread's cache
 * live, each gets the larger KP_TCACHE_MAX_BYTES (an even share of the
 * total would be more), and this thread's lists fill past the solo budget;
 * when the other thread exits, overflows bring them back within it. */
static void test_a_lone_cache_has_the_solo_budget(void) {
    _Static_assert(KP_TCACHE_SOLO_BYTES < KP_TCACHE_MAX_BYTES, "the two budgets differ");
    _Static_assert(KP_TCACHE_TOTAL_BYTES / 2 >= KP_TCACHE_MAX_BYTES, "two threads get the maximum");
    kp_tcache *tc = _kp_tcache_get();
    CHECK_EQ(_kp_tcache_budget_cap(), KP_TCACHE_SOLO_BYTES);
    CHECK(!churn_large_blocks());
    CHECK(tc->budget_used <= KP_TCACHE_SOLO_BYTES);
    pthread_barrier_init(&live_barrier, NULL, 2);
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, hold_a_cache, NULL), 0);
    pthread_barrier_wait(&live_barrier);      /* both caches are live */
    CHECK_EQ(_kp_tcache_budget_cap(), KP_TCACHE_MAX_BYTES);
    CHECK(!churn_large_blocks());
    size_t paired = tc->budget_used;
    pthread_barrier_wait(&live_barrier);      /* measured: the other thread may exit */
    pthread_join(t, NULL);
    pthread_barrier_destroy(&live_barrier);
    CHECK(paired > KP_TCACHE_SOLO_BYTES);
    CHECK(paired <= KP_TCACHE_MAX_BYTES);
    CHECK_EQ(_kp_tcache_budget_cap(), KP_TCACHE_SOLO_BYTES);
    for (int round = 0; round < 64; round++) alloc_then_free(4096, 128);   /* each round overflows */
    CHECK(tc->budget_used <= KP_TCACHE_SOLO_BYTES);
}

static void test_thread_flush_empties_this_cache(void) {
    void *p = kp_malloc(300);
    kp_free(p);
    kp_thread_flush();
    kp_tcache *tc = _kp_tcache_get();
    for (unsigned c = 1; c < KP_NUM_CLASSES; c++) CHECK_EQ(KP_LOAD(tc->lists[c].count), 0);
}

static void *alloc_and_leave(void *arg) {
    (void)arg;
    void *v[200];
    for (int i = 0; i < 200; i++) v[i] = kp_malloc(208);
    for (int i = 0; i < 200; i++) kp_free(v[i]);
    return NULL;   /* the thread holds cached blocks when it exits */
}

static void test_exited_threads_give_everything_back(void) {
    kp_thread_flush();
    unsigned cls = _kp_size_class(208);
    for (int round = 0; round < 50; round++) {
        pthread_t t;
        pthread_create(&t, NULL, alloc_and_leave, NULL);
        pthread_join(t, NULL);
    }
    CHECK_EQ(cached_in_all_threads(cls), 0);
    kp_stats st = { .struct_size = sizeof st };
    kp_stats_get(&st);
    CHECK_EQ(st.threads, 1);
    CHECK(st.classes[cls - 1].allocs >= 50 * 200);
    CHECK(_kp_central_is_valid(cls));
}

static void *free_what_main_made(void *arg) {
    void **v = arg;
    for (int i = 0; i < 100; i++) kp_free(v[i]);
    return NULL;
}

static void test_cross_thread_frees(void) {
    void *v[100];
    for (int i = 0; i < 100; i++) v[i] = kp_malloc(96);
    pthread_t t;
    pthread_create(&t, NULL, free_what_main_made, v);
    pthread_join(t, NULL);
    CHECK(_kp_central_is_valid(_kp_size_class(96)));
}

int main(void) {
    _kp_init();
    RUN(test_refill_and_overflow_move_batches);
    RUN(test_refills_grow_a_list_past_what_frees_reach);
    RUN(test_byte_cap);
    RUN(test_a_lone_cache_has_the_solo_budget);
    RUN(test_budget_is_shared_among_threads);
    RUN(test_cache_over_its_share_gives_back);
    RUN(test_thread_flush_empties_this_cache);
    RUN(test_exited_threads_give_everything_back);
    RUN(test_cross_thread_frees);
    return DONE();
}
