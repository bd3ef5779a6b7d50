/* test_nokeys.c: kpool in a process that has used up its pthread keys
 * before kpool's first allocation. kpool must not write into a key it does
 * not own (another library's destructor would receive kpool's cache), and
 * threads run uncached: their blocks go straight to the shared lists, so
 * nothing is stranded in a cache that no destructor gives back. */
#include "check.h"
#include "kp_internal.h"

#include <limits.h>

static pthread_key_t keys[PTHREAD_KEYS_MAX];
static int nkeys;
static _Atomic int foreign_destructor_calls;

static void someone_elses_destructor(void *p) {
    (void)p;
    atomic_fetch_add(&foreign_destructor_calls, 1);
}

static void *worker(void *arg) {
    int *bad = arg;
    void *v[200];
    for (int round = 0; round < 50; round++) {
        for (int i = 0; i < 200; i++) v[i] = kp_malloc(16 + (size_t)i * 8);
        for (int i = 0; i < 200; i++) kp_free(v[i]);
    }
    for (int k = 0; k < nkeys; k++)
        if (pthread_getspecific(keys[k]) != NULL) *bad = 1;   /* kpool wrote into a key it does not own */
    return NULL;
}

static void test_threads_run_uncached_without_a_key(void) {
    int bad = 0;
    pthread_t t[3];
    for (int i = 0; i < 3; i++) pthread_create(&t[i], NULL, worker, &bad);
    for (int i = 0; i < 3; i++) pthread_join(t[i], NULL);
    CHECK_EQ(bad, 0);
    CHECK_EQ(atomic_load(&foreign_destructor_calls), 0);
    kp_stats st = { .struct_size = sizeof st };
    CHECK_EQ(kp_stats_get(&st), 0);
    CHECK_EQ(st.tcaches_unavailable, 1);
    CHECK(st.uncached_ops >= 3 * 50 * 400);
    CHECK_EQ(st.threads, 0);
    CHECK_EQ(st.bytes_free_tcaches, 0);         /* nothing stranded in a cache */
    size_t live = 0;
    for (size_t k = 0; k < st.nclasses; k++) live += st.classes[k].in_use;
    CHECK_EQ(live, 0);
    for (unsigned c = 1; c < KP_NUM_CLASSES; c++) CHECK(_kp_central_is_valid(c));
}

int main(void) {
    /* before any kpool call that makes a thread cache */
    while (nkeys < PTHREAD_KEYS_MAX && pthread_key_create(&keys[nkeys], someone_elses_destructor) == 0) nkeys++;
    printf("     %d keys made before kpool's first allocation\n", nkeys);
    RUN(test_threads_run_uncached_without_a_key);
    return DONE();
}
