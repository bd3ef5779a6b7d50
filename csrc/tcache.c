/* tcache.c: per-thread caches of free objects.
 *
 * Job: one LIFO list per size class per thread, used by kp_malloc/kp_free
 * (heap.c) with no locks and no atomic read-modify-writes. An empty list is
 * refilled with one batch from the central list; a list longer than its
 * class's tcache_max gives one batch back; a cache holding more than
 * KP_TCACHE_MAX_BYTES gives back half of its largest list (in bytes). When a
 * thread exits, a pthread key destructor gives everything back, so threads
 * that never call kpool at exit are covered too.
 * Calls: central (batches), pool (dropping pool caches), stats (absorb).
 * Invariants: count == length of head's list; bytes == sum(count * size);
 *   a cache is on the registry from creation until its thread's destructor.
 * Locks: the registry lock guards the list of caches (stats readers walk it;
 *   creation and exit update it). The owner never takes it on the fast path.
 *   Order: registry lock before central locks (kp_internal.h).
 * TLS: one initial-exec pointer (8 bytes, so the library can still be
 *   dlopen'ed); the cache itself lives in kpool's metadata.
 */
#include "kp_internal.h"

__thread kp_tcache *_kp_tls_tcache __attribute__((tls_model("initial-exec")));
static __thread int tls_exited __attribute__((tls_model("initial-exec")));

static kp_lock registry_lock = { .mutex = PTHREAD_MUTEX_INITIALIZER };
static kp_tcache registry = { .reg_next = &registry, .reg_prev = &registry };
/* What exited threads (and threads without a cache) counted; its lists'
 * counters and `counters` are written under the registry lock. */
static kp_tcache retired;

void (*_kp_tcache_pool_hook)(kp_tcache *tc);
static pthread_key_t exit_key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;

void _kp_registry_lock(void) { _kp_lock(&registry_lock); }
void _kp_registry_unlock(void) { _kp_unlock(&registry_lock); }
kp_lock *_kp_registry_lock_ptr(void) { return &registry_lock; }
const kp_tcache *_kp_tcache_retired(void) { return &retired; }

kp_tcache *_kp_registry_first(void) {
    return registry.reg_next == &registry ? NULL : registry.reg_next;
}
kp_tcache *_kp_registry_next(kp_tcache *tc) {
    return tc->reg_next == &registry ? NULL : tc->reg_next;
}

static void thread_exit(void *arg);
static void make_key(void) { pthread_key_create(&exit_key, thread_exit); }

kp_tcache *_kp_tcache_get(void) {
    kp_tcache *tc = _kp_tls_tcache;
    if (KP_LIKELY(tc != NULL)) return tc;
    if (tls_exited) return NULL;
    _kp_init();
    pthread_once(&key_once, make_key);
    tc = _kp_meta_alloc(sizeof(kp_tcache));
    if (!tc) return NULL;
    memset(tc, 0, sizeof *tc);
    for (unsigned c = 1; c < KP_NUM_CLASSES; c++) tc->lists[c].max = _kp_classes[c].tcache_max;
    tc->thread = pthread_self();
    _kp_lock(&registry_lock);
    tc->reg_next = registry.reg_next;
    tc->reg_prev = &registry;
    registry.reg_next->reg_prev = tc;
    registry.reg_next = tc;
    _kp_unlock(&registry_lock);
    pthread_setspecific(exit_key, tc);
    _kp_tls_tcache = tc;
    return tc;
}

/* Detach the first n objects of list l (n <= count). */
static void *take_front(kp_tlist *l, unsigned n) {
    void *head = l->head, *last = head;
    for (unsigned i = 1; i < n; i++) last = *(void **)last;
    l->head = *(void **)last;
    *(void **)last = NULL;
    KP_STORE(l->count, KP_LOAD(l->count) - n);
    return head;
}

static void give_back(kp_tcache *tc, unsigned cls, unsigned n) {
    kp_tlist *l = &tc->lists[cls];
    if (n > KP_LOAD(l->count)) n = KP_LOAD(l->count);
    if (n == 0) return;
    void *chain = take_front(l, n);
    tc->bytes -= (size_t)n * _kp_classes[cls].size;
    _kp_central_return(cls, chain, n);
    KP_STAT_BUMP(tc->counters.central_returns, 1);
}

void *_kp_tcache_refill(kp_tcache *tc, unsigned cls) {
    kp_tlist *l = &tc->lists[cls];
    void *head, *tail;
    unsigned got = _kp_central_fetch(cls, _kp_classes[cls].batch, &head, &tail);
    if (got == 0) return NULL;
    KP_STAT_BUMP(tc->counters.tcache_misses, 1);
    KP_STAT_BUMP(tc->counters.central_fetches, 1);
    void *obj = head;
    *(void **)tail = l->head;
    l->head = *(void **)obj;
    KP_STORE(l->count, KP_LOAD(l->count) + got - 1);
    tc->bytes += (size_t)(got - 1) * _kp_classes[cls].size;
    return obj;
}

void _kp_tcache_overflow(kp_tcache *tc, unsigned cls) {
    kp_tlist *l = &tc->lists[cls];
    if (KP_LOAD(l->count) > l->max) give_back(tc, cls, _kp_classes[cls].batch);
    if (tc->bytes > KP_TCACHE_MAX_BYTES) {
        unsigned longest = 0;
        size_t most = 0;
        for (unsigned c = 1; c < KP_NUM_CLASSES; c++) {
            size_t b = (size_t)KP_LOAD(tc->lists[c].count) * _kp_classes[c].size;
            if (b > most) { most = b; longest = c; }
        }
        if (longest) give_back(tc, longest, (KP_LOAD(tc->lists[longest].count) + 1) / 2);
    }
}

void _kp_tcache_flush_all(kp_tcache *tc) {
    for (unsigned c = 1; c < KP_NUM_CLASSES; c++) {
        while (KP_LOAD(tc->lists[c].count) > 0) give_back(tc, c, KP_BATCH_MAX);
    }
}

void _kp_tcache_flush_thread(kp_tcache *tc) {
    _kp_tcache_flush_all(tc);
    void (*hook)(kp_tcache *) = _kp_tcache_pool_hook;
    if (hook) hook(tc);
}

#define ABSORB(field) KP_BUMP(retired.field, KP_LOAD(tc->field))

/* Fold tc's counters into `retired`. REQUIRES registry lock. */
static void absorb(kp_tcache *tc) {
    for (unsigned c = 1; c < KP_NUM_CLASSES; c++) {
        ABSORB(lists[c].allocs);
        ABSORB(lists[c].frees);
    }
    ABSORB(counters.tcache_misses);
    ABSORB(counters.central_fetches);
    ABSORB(counters.central_returns);
    ABSORB(counters.requested_alloc);
    ABSORB(counters.requested_free);
    ABSORB(counters.unsized_frees);
}

void _kp_tcache_count_uncached(unsigned cls, int is_alloc, size_t requested) {
    _kp_lock(&registry_lock);
    if (is_alloc) {
        KP_BUMP(retired.lists[cls].allocs, 1);
        KP_BUMP(retired.counters.requested_alloc, requested);
    } else {
        KP_BUMP(retired.lists[cls].frees, 1);
        KP_BUMP(retired.counters.requested_free, requested);
    }
    _kp_unlock(&registry_lock);
}

/* Give everything back and leave the registry. The caller ensures tc's
 * owner will not use it again. */
static void destroy_cache(kp_tcache *tc) {
    _kp_tcache_flush_thread(tc);
    _kp_lock(&registry_lock);
    tc->reg_prev->reg_next = tc->reg_next;
    tc->reg_next->reg_prev = tc->reg_prev;
    absorb(tc);
    _kp_unlock(&registry_lock);
    _kp_meta_free(tc, sizeof(kp_tcache));
}

static void thread_exit(void *arg) {
    kp_tcache *tc = arg;
    if (!tc || tc != _kp_tls_tcache) return;
    tls_exited = 1;          /* later calls in this thread bypass the cache */
    _kp_tls_tcache = NULL;
    destroy_cache(tc);
}

/* A thread that was inside its fast path when another thread forked left
 * count and bytes out of step with its lists (each list head is always
 * whole: it is one store). Recount from the links. */
static void recount(kp_tcache *tc) {
    tc->bytes = 0;
    for (unsigned c = 1; c < KP_NUM_CLASSES; c++) {
        uint32_t n = 0;
        for (void *p = tc->lists[c].head; p; p = *(void **)p) n++;
        KP_STORE(tc->lists[c].count, n);
        tc->bytes += (size_t)n * _kp_classes[c].size;
    }
}

void _kp_tcache_after_fork_child(void) {
    kp_tcache *mine = _kp_tls_tcache;
    kp_tcache *tc = registry.reg_next;
    while (tc != &registry) {
        kp_tcache *next = tc->reg_next;
        if (tc != mine) {
            recount(tc);
            destroy_cache(tc);
        }
        tc = next;
    }
}
