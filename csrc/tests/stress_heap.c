/* stress_heap.c: multithreaded stress of the heap and the pools.
 *
 * usage: stress_heap [THREADS] [SCALE] [ITER]
 *   THREADS threads each keep SCALE*500 live slots and run ITER rounds of
 *   SCALE*20000 random replacements: sizes mostly 16..1024 B, some up to
 *   64 KiB, a few up to 1 MiB. Every block carries a cookie (its size and an
 *   address-derived word, and a fill pattern) that is checked before it is
 *   freed. One block in 8 is traded through a shared exchange array, so it
 *   is freed by another thread than the one that allocated it. Pool blocks
 *   (an unbounded pool and a bounded one) are traded the same way; the
 *   bounded pool's capacity is checked against a live count.
 * Seeded (KP_STRESS_SEED, default 1), so a failing run can be repeated.
 * Exits non-zero on a damaged cookie or a broken invariant.
 */
#include "kp_internal.h"

#include <stdio.h>
#include <stdlib.h>

#define EXCHANGE 256
#define POOL_BLOCK 96
#define POOL_CAP 64

static _Atomic(void *) exchange[EXCHANGE];
static _Atomic(void *) pool_exchange[EXCHANGE];
static kp_pool *free_pool, *bounded_pool;
static _Atomic int bounded_live, failures;
static int scale = 1, iters = 1;

static uint64_t next_rand(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void fail(const char *what, void *p) {
    fprintf(stderr, "stress_heap: %s at %p\n", what, p);
    atomic_fetch_add(&failures, 1);
}

static uint64_t cookie_of(void *p) { return (uintptr_t)p * 0x9e3779b97f4a7c15ull ^ 0x5bd1e995u; }

static void stamp(void *p, size_t size) {
    uint64_t *w = p;
    w[0] = size;
    w[1] = cookie_of(p);
    unsigned char fill = (unsigned char)cookie_of(p);
    unsigned char *b = p;
    size_t n = size < 256 ? size : 64;
    for (size_t i = 16; i < n; i++) b[i] = fill;
    if (size >= 256) for (size_t i = size - 48; i < size; i++) b[i] = fill;
}

static size_t check(void *p) {
    uint64_t *w = p;
    size_t size = w[0];
    if (w[1] != cookie_of(p) || size < 16 || size > (2u << 20)) {
        fail("damaged cookie", p);
        return 0;
    }
    unsigned char fill = (unsigned char)cookie_of(p);
    unsigned char *b = p;
    size_t n = size < 256 ? size : 64;
    for (size_t i = 16; i < n; i++) if (b[i] != fill) { fail("damaged fill", p); return 0; }
    if (size >= 256) for (size_t i = size - 48; i < size; i++) if (b[i] != fill) { fail("damaged tail", p); return 0; }
    if (kp_usable_size(p) < size) fail("usable size below the request", p);
    return size;
}

static size_t random_size(uint64_t *rng) {
    uint64_t r = next_rand(rng);
    unsigned pick = r % 1000;
    if (pick < 900) return 16 + (r >> 16) % 1009;
    if (pick < 995) return 1024 + (r >> 16) % (64 << 10);
    return (64 << 10) + (r >> 16) % (1 << 20);
}

static void release(void *p, uint64_t *rng) {
    size_t size = check(p);
    if (!size) return;
    ((uint64_t *)p)[1] = 0;
    if (next_rand(rng) & 1) kp_free(p);
    else kp_free_sized(p, size);
}

static void pool_release(void *p) {
    uint64_t *w = p;
    if (w[1] != cookie_of(p)) { fail("damaged pool cookie", p); return; }
    w[1] = 0;
    if (w[0] == 1) {
        atomic_fetch_sub(&bounded_live, 1);
        kp_pool_free(bounded_pool, p);
    } else {
        kp_pool_free(free_pool, p);
    }
}

static void *worker(void *arg) {
    uint64_t rng = (uint64_t)(uintptr_t)arg;
    size_t nslots = (size_t)scale * 500;
    void **slots = calloc(nslots, sizeof *slots);
    void **pslots = calloc(nslots, sizeof *pslots);
    for (int it = 0; it < iters; it++) {
        for (long op = 0; op < (long)scale * 20000; op++) {
            uint64_t r = next_rand(&rng);
            size_t k = r % nslots;
            if (slots[k]) release(slots[k], &rng);
            size_t size = random_size(&rng);
            void *p = (r >> 40) % 16 == 0 ? kp_calloc(1, size) : kp_malloc(size);
            if (!p) { fail("out of memory", NULL); break; }
            stamp(p, size);
            slots[k] = p;
            if ((r >> 32) % 8 == 0) {
                void *other = atomic_exchange(&exchange[(r >> 20) % EXCHANGE], slots[k]);
                slots[k] = other;     /* may be NULL, or another thread's block */
            }
            /* pools */
            size_t j = (r >> 12) % nslots;
            if (pslots[j]) pool_release(pslots[j]);
            pslots[j] = NULL;
            int bounded = (r >> 50) % 4 == 0;
            void *q = kp_pool_alloc(bounded ? bounded_pool : free_pool);
            if (q) {
                if (bounded && atomic_fetch_add(&bounded_live, 1) + 1 > POOL_CAP) fail("pool capacity exceeded", q);
                ((uint64_t *)q)[0] = (uint64_t)bounded;
                ((uint64_t *)q)[1] = cookie_of(q);
                pslots[j] = q;
                if ((r >> 56) % 4 == 0) pslots[j] = atomic_exchange(&pool_exchange[(r >> 24) % EXCHANGE], q);
            } else if (!bounded) {
                fail("unbounded pool refused", NULL);
            }
        }
    }
    for (size_t k = 0; k < nslots; k++) {
        if (slots[k]) release(slots[k], &rng);
        if (pslots[k]) pool_release(pslots[k]);
    }
    free(slots);
    free(pslots);
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 4;
    scale = argc > 2 ? atoi(argv[2]) : 1;
    iters = argc > 3 ? atoi(argv[3]) : 1;
    const char *seed_env = getenv("KP_STRESS_SEED");
    uint64_t seed = seed_env ? strtoull(seed_env, NULL, 10) : 1;
    if (threads < 1 || scale < 1 || iters < 1) {
        fprintf(stderr, "usage: stress_heap [THREADS] [SCALE] [ITER]\n");
        return 2;
    }
    free_pool = kp_pool_create(POOL_BLOCK, 0, 0);
    bounded_pool = kp_pool_create(POOL_BLOCK, 0, POOL_CAP);
    kp_stats before = { .struct_size = sizeof before };
    kp_stats_get(&before);
    pthread_t *t = calloc((size_t)threads, sizeof *t);
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)(seed * 1000 + (uint64_t)i));
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    free(t);
    uint64_t rng = seed;
    for (int i = 0; i < EXCHANGE; i++) {
        void *p = atomic_exchange(&exchange[i], NULL);
        if (p) release(p, &rng);
        void *q = atomic_exchange(&pool_exchange[i], NULL);
        if (q) pool_release(q);
    }
    kp_thread_flush();
    kp_stats after = { .struct_size = sizeof after };
    kp_stats_get(&after);
    if (after.bytes_in_use != before.bytes_in_use) fail("bytes in use did not return to the start", NULL);
    for (unsigned c = 1; c < KP_NUM_CLASSES; c++)
        if (!_kp_central_is_valid(c)) fail("central list invalid", NULL);
    if (!_kp_pageheap_is_valid()) fail("page heap invalid", NULL);
    kp_pool_stats ps = { .struct_size = sizeof ps };
    kp_pool_stats_get(bounded_pool, &ps);
    if (ps.high_water > POOL_CAP || ps.live != 0) fail("bounded pool figures", NULL);
    kp_pool_destroy(free_pool);
    kp_pool_destroy(bounded_pool);
    int f = atomic_load(&failures);
    printf("stress_heap: %d threads, scale %d, %d iterations, seed %llu: %s (%llu allocs)\n", threads, scale, iters,
           (unsigned long long)seed, f ? "FAILED" : "ok", (unsigned long long)(after.allocs - before.allocs));
    return f ? 1 : 0;
}
