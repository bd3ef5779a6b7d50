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

static void test_refill_and_overflow_move_batches(void) {
    unsigned cls = _kp_size_class(80);
    kp_tcache *tc = _kp_tcache_get();
    CHECK(tc != NULL);
    kp_thread_flush();
    CHECK_EQ(KP_LOAD(tc->lists[cls].count), 0);
    void *p = kp_malloc(80);
    CHECK_EQ(KP_LOAD(tc->lists[cls].count), _kp_classes[cls].batch - 1);
    kp_free(p);
    enum { N = 1000 };
    void *v[N];
    for (int i = 0; i < N; i++) v[i] = kp_malloc(80);
    for (int i = 0; i < N; i++) kp_free(v[i]);
    CHECK(KP_LOAD(tc->lists[cls].count) <= tc->lists[cls].max);
    CHECK(_kp_central_is_valid(cls));
}

static void test_byte_cap(void) {
    kp_tcache *tc = _kp_tcache_get();
    enum { N = 64 };
    void *v[N];
    for (int s = 0; s < 6; s++) {
        size_t size = (size_t)(32 << 10) << s;
        if (size > KP_SMALL_MAX) break;
        for (int i = 0; i < N; i++) v[i] = kp_malloc(size);
        for (int i = 0; i < N; i++) kp_free(v[i]);
        size_t held = 0, budget = 0;
        for (unsigned c = 1; c < KP_NUM_CLASSES; c++) {
            held += (size_t)KP_LOAD(tc->lists[c].count) * _kp_classes[c].size;
            budget += (size_t)tc->lists[c].max * _kp_classes[c].size;
            CHECK(KP_LOAD(tc->lists[c].count) <= tc->lists[c].max);
        }
        CHECK(held <= KP_TCACHE_MAX_BYTES);
        CHECK_EQ(budget, tc->budget_used);
        CHECK(budget <= KP_TCACHE_MAX_BYTES);
    }
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
    RUN(test_byte_cap);
    RUN(test_thread_flush_empties_this_cache);
    RUN(test_exited_threads_give_everything_back);
    RUN(test_cross_thread_frees);
    return DONE();
}
