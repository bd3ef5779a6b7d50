/* tcache.c: per-thread caches of free objects.
 *
 * Job: one LIFO list per size class per thread, used by kp_malloc/kp_free
 * (heap.c) with no locks and no atomic read-modify-writes. An empty list is
 * refilled with one batch from the central list; a list longer than its
 * max gives one batch back. A list's max starts at 0 and doubles per refill
 * up to one batch (slow start: a class a thread touches once does not make
 * a whole batch resident: 1.4 MB of peak RSS in a Python ast run), then
 * grows a batch per overflow up to its class's tcache_free_max. Past that
 * only a refill grows it, by what it gave back since its last refill, up to
 * tcache_max: a thread that allocates again what it freed keeps it in its
 * list, out of the central lists' way, and a thread that only frees (or
 * only allocates) a class keeps a few batches. The byte cap is a budget of
 * list lengths: a list grows its max while sum(max * size) stays
 * within the thread's budget, else it takes budget from larger lists, a few
 * per call in round-robin order, which give back what no longer fits. The
 * budget is KP_TCACHE_SOLO_BYTES while one cache is live, else an even share
 * of KP_TCACHE_TOTAL_BYTES among live caches, within
 * [KP_TCACHE_MIN_BYTES, KP_TCACHE_MAX_BYTES]: with many threads each caches
 * less (all together: the total up to total / min threads, then the minimum
 * per thread). A cache over its share (threads were started) gives the
 * excess back over its next overflows, from up to KP_STEAL_TRIES lists at a
 * time. When a thread exits, a pthread key destructor gives everything back,
 * so threads that never call kpool at exit are covered too.
 * Calls: central (batches), pool (through a hook: dropping pool caches).
 * Invariants: count == length of head's list <= max <= the class's tcache_max;
 *   budget_used == sum(max * size) <= KP_TCACHE_MAX_BYTES, and after any
 *   grow or overflow of a list <= budget_cap() (or as near as KP_STEAL_TRIES
 *   shrinks get it);
 *   a cache is on the registry from creation until its thread's destructor.
 * Locks: the registry lock guards the list of caches (stats readers walk it;
 *   creation and exit update it). The owner never takes it on the fast path.
 *   Order: registry lock before central locks (kp_internal.h).
 * TLS: one initial-exec pointer (8 bytes, so the library can still be
 *   dlopen'ed); the cache itself lives in kpool's metadata. A thread
 *   without a cache points at _kp_empty_tcache, which nothing writes.
 */
#include "kp_internal.h"

kp_tcache _kp_empty_tcache;
__thread kp_tcache *_kp_tls_tcache __attribute__((tls_model("initial-exec"))) = &_kp_empty_tcache;
static __thread int tls_exited __attribute__((tls_model("initial-exec")));

static kp_lock registry_lock = { .mutex = PTHREAD_MUTEX_INITIALIZER };
static kp_tcache registry = { .reg_next = &registry, .reg_prev = &registry };
/* What exited threads (and threads without a cache) counted; written and
 * read under the registry lock. */
static kp_tcache_totals retired;
static _Atomic size_t live_caches;   /* caches on the registry (written under its lock) */

void (*_kp_tcache_pool_hook)(kp_tcache *tc);
static pthread_key_t exit_key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;

void _kp_registry_lock(void) { _kp_lock(&registry_lock); }
void _kp_registry_unlock(void) { _kp_unlock(&registry_lock); }
kp_lock *_kp_registry_lock_ptr(void) { return &registry_lock; }
kp_tcache *_kp_registry_first(void) {
    return registry.reg_next == &registry ? NULL : registry.reg_next;
}
kp_tcache *_kp_registry_next(kp_tcache *tc) {
    return tc->reg_next == &registry ? NULL : tc->reg_next;
}

static void thread_exit(void *arg);
static void destroy_cache(kp_tcache *tc);
/* 1 once the exit key exists. Without it (the process used up its
 * PTHREAD_KEYS_MAX keys) no cache could be given back at thread exit, so
 * every thread runs uncached, through the central lists. */
static _Atomic int key_ok;
static void make_key(void) { atomic_store(&key_ok, pthread_key_create(&exit_key, thread_exit) == 0); }

int _kp_tcache_disabled(void) {
    pthread_once(&key_once, make_key);
    return !atomic_load(&key_ok) || _kp_guard_every;
}

kp_tcache *_kp_tcache_get(void) {
    kp_tcache *tc = _kp_tcache_mine();
    if (KP_LIKELY(tc != NULL)) return tc;
    if (tls_exited) return NULL;
    _kp_init();
    pthread_once(&key_once, make_key);
    /* no key: no way to give a cache back at exit; guard sampling: every
     * allocation must reach the slow path that samples it */
    if (!atomic_load_explicit(&key_ok, memory_order_relaxed) || _kp_guard_every) return NULL;
    tc = _kp_meta_alloc(sizeof(kp_tcache));
    if (!tc) return NULL;
    memset(tc, 0, sizeof *tc);
    tc->thread = pthread_self();
    _kp_lock(&registry_lock);
    tc->reg_next = registry.reg_next;
    tc->reg_prev = &registry;
    registry.reg_next->reg_prev = tc;
    registry.reg_next = tc;
    KP_BUMP(live_caches, 1);
    _kp_unlock(&registry_lock);
    /* The cache is this thread's before pthread_setspecific, which may call
     * malloc (keys past the first 32), so that call finds it. */
    _kp_tls_tcache = tc;
    if (pthread_setspecific(exit_key, tc) != 0) {
        _kp_tls_tcache = &_kp_empty_tcache;
        destroy_cache(tc);
        return NULL;
    }
    return tc;
}

void _kp_tcache_pop(kp_tlist *l, void *p) {
    void *next = _kp_next(p);
    if (!_kp_link_ok(next)) {
        _kp_report_bad_link("kp_malloc", p);
        next = NULL;                    /* the rest is lost, but never handed out */
        KP_STORE(l->count, 1);
    }
    l->head = next;
    KP_STORE(l->count, KP_LOAD(l->count) - 1);
}

/* Detach the first n objects of list l (n <= count); *got says how many
 * it could (fewer if a damaged link ends the list early). */
static void *take_front(kp_tlist *l, unsigned n, unsigned *got) {
    void *head = l->head, *last = head;
    unsigned i = 1;
    for (; i < n; i++) {
        void *next = _kp_next(last);
        if (!_kp_link_ok(next) || !next) break;
        last = next;
    }
    void *rest = _kp_next(last);
    if (!_kp_link_ok(rest)) {
        _kp_report_bad_link("kp_free", last);
        rest = NULL;
        KP_STORE(l->count, i);
    }
    l->head = rest;
    _kp_set_next(last, NULL);
    KP_STORE(l->count, KP_LOAD(l->count) - i);
    *got = i;
    return head;
}

static void give_back(kp_tcache *tc, unsigned cls, unsigned n) {
    kp_tlist *l = &tc->lists[cls];
    if (n > KP_LOAD(l->count)) n = KP_LOAD(l->count);
    if (n == 0) return;
    void *chain = take_front(l, n, &n);
    _kp_central_return(cls, chain, n);
    KP_BUMP(tc->moves[cls].returned, n);
    KP_STAT_BUMP(tc->counters.central_returns, 1);
}

/* Lower list c's max by up to `bytes` worth; give back what no longer fits. */
static size_t shrink(kp_tcache *tc, unsigned c, size_t bytes) {
    kp_tlist *l = &tc->lists[c];
    size_t size = _kp_classes[c].size;
    uint32_t drop = (uint32_t)((bytes + size - 1) / size);
    if (drop > l->max) drop = l->max;
    l->max -= drop;
    tc->budget_used -= (size_t)drop * size;
    uint32_t n = KP_LOAD(l->count);
    if (n > l->max) give_back(tc, c, n - l->max);
    return (size_t)drop * size;
}

size_t _kp_tcache_budget_cap(void) {
    size_t n = KP_LOAD(live_caches);
    if (n <= 1) return KP_TCACHE_SOLO_BYTES;
    size_t share = KP_TCACHE_TOTAL_BYTES / n;
    return share > KP_TCACHE_MAX_BYTES ? KP_TCACHE_MAX_BYTES : share < KP_TCACHE_MIN_BYTES ? KP_TCACHE_MIN_BYTES : share;
}

/* Raise cls's max by `step` objects, up to limit. Over the cap, budget is
 * taken from lists that hold more than cls (from any list, cls too, while
 * the cache is over its share even without growing), looked at round-robin
 * a few at a time, so a full budget costs O(1) per call, not a scan of
 * every class. 1 if it grew. */
static int grow(kp_tcache *tc, unsigned cls, uint32_t limit, uint32_t step) {
    const kp_class_info *ci = &_kp_classes[cls];
    kp_tlist *l = &tc->lists[cls];
    size_t cap = _kp_tcache_budget_cap();
    uint32_t room = l->max < limit ? limit - l->max : 0;
    uint32_t more = room < step ? room : step;
    size_t need = (size_t)more * ci->size;
    size_t mine = (size_t)l->max * ci->size;
    for (unsigned tries = 0; tc->budget_used + need > cap && tries < KP_STEAL_TRIES; tries++) {
        unsigned c = tc->steal_next;
        tc->steal_next = c + 1 < KP_NUM_CLASSES ? c + 1 : 1;
        int over_share = tc->budget_used > cap;
        if (tc->lists[c].max == 0) continue;   /* nothing to take (class 0 always) */
        if (!over_share && (c == cls || (size_t)tc->lists[c].max * _kp_classes[c].size <= mine)) continue;
        shrink(tc, c, tc->budget_used + need - cap);
    }
    if (more == 0 || tc->budget_used + need > cap) return 0;
    l->max += more;
    tc->budget_used += need;
    return 1;
}

/* Slow start: below one batch a list's max doubles, then grows a batch. */
static uint32_t slow_start_step(const kp_tlist *l, const kp_class_info *ci) {
    return l->max < ci->batch ? (l->max ? l->max : 1) : ci->batch;
}

void *_kp_tcache_refill(kp_tcache *tc, unsigned cls) {
    kp_tlist *l = &tc->lists[cls];
    const kp_class_info *ci = &_kp_classes[cls];
    kp_tmoves *m = &tc->moves[cls];
    _kp_pageheap_tick();
    if (_kp_mesh_on) _kp_mesh_tick();
    if (l->max + 1 < ci->batch) {
        (void)grow(tc, cls, ci->tcache_free_max, slow_start_step(l, ci));
    } else if (m->spilled) {
        /* The thread allocates again what its list gave back since the last
         * refill: a list that long would have kept it all. */
        uint32_t step = (m->spilled + ci->batch - 1) / ci->batch * ci->batch;
        (void)grow(tc, cls, ci->tcache_max, step);
    }
    m->spilled = 0;
    unsigned want = ci->batch;
    if (want > l->max + 1) want = l->max + 1;
    void *head;
    /* the list may hold max after this pop: whole span lists fill it */
    unsigned got = _kp_central_fetch(cls, want, l->max + 1, &head);
    if (got == 0) return NULL;
    KP_BUMP(m->fetched, got);
    KP_STAT_BUMP(tc->counters.tcache_misses, 1);
    KP_STAT_BUMP(tc->counters.central_fetches, 1);
    kp_assert(l->head == NULL);    /* refills happen only when the list is empty */
    KP_STORE(l->count, got);
    _kp_tcache_pop(l, head);
    return head;
}

void _kp_tcache_overflow(kp_tcache *tc, unsigned cls) {
    kp_tlist *l = &tc->lists[cls];
    const kp_class_info *ci = &_kp_classes[cls];
    _kp_pageheap_tick();         /* idle pages go back even when nothing else reaches the page heap */
    if (_kp_mesh_on) _kp_mesh_tick();
    if (KP_LOAD(l->count) <= l->max || grow(tc, cls, ci->tcache_free_max, slow_start_step(l, ci))) return;
    unsigned n = KP_LOAD(l->count) - l->max;
    if (n < ci->batch) n = ci->batch;
    if (n > KP_LOAD(l->count)) n = KP_LOAD(l->count);
    give_back(tc, cls, n);
    uint32_t spilled = tc->moves[cls].spilled + n;
    tc->moves[cls].spilled = spilled < ci->tcache_max ? spilled : ci->tcache_max;
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

/* Add tc's counters to t. REQUIRES registry lock. */
static void add_totals(kp_tcache_totals *t, const kp_tcache *tc) {
    for (unsigned c = 1; c < KP_NUM_CLASSES; c++) {
        uint64_t allocs = KP_LOAD(tc->lists[c].allocs);
        uint32_t count = KP_LOAD(tc->lists[c].count);
        t->allocs[c] += allocs;
        t->frees[c] += allocs + count - KP_LOAD(tc->moves[c].fetched) + KP_LOAD(tc->moves[c].returned);
        t->unsized[c] += KP_LOAD(tc->moves[c].unsized_frees);
        t->requested += KP_LOAD(tc->lists[c].requested);
        t->cached[c] += count;
    }
    t->tcache_misses += KP_LOAD(tc->counters.tcache_misses);
    t->central_fetches += KP_LOAD(tc->counters.central_fetches);
    t->central_returns += KP_LOAD(tc->counters.central_returns);
}

void _kp_tcache_totals(kp_tcache_totals *out) {
    _kp_lock(&registry_lock);
    *out = retired;
    size_t n = 0;
    for (kp_tcache *tc = registry.reg_next; tc != &registry; tc = tc->reg_next) {
        add_totals(out, tc);
        n++;
    }
    _kp_unlock(&registry_lock);
    out->threads = n;
}

void _kp_tcache_count_uncached(unsigned cls, int is_alloc, int sized, size_t requested) {
    _kp_lock(&registry_lock);
    retired.uncached_ops++;
    if (is_alloc) {
        retired.allocs[cls]++;
        retired.requested += requested;
    } else {
        retired.frees[cls]++;
        if (sized) retired.requested -= requested;
        else retired.unsized[cls]++;     /* as a cached free of untold size: an estimate */
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
    add_totals(&retired, tc);
    for (unsigned c = 1; c < KP_NUM_CLASSES; c++) retired.cached[c] = 0;
    KP_DROP(live_caches, 1);
    _kp_unlock(&registry_lock);
    _kp_meta_free(tc, sizeof(kp_tcache));
}

static void thread_exit(void *arg) {
    kp_tcache *tc = arg;
    if (!tc || tc != _kp_tls_tcache) return;
    tls_exited = 1;          /* later calls in this thread bypass the cache */
    _kp_tls_tcache = &_kp_empty_tcache;
    destroy_cache(tc);
}

/* A thread that was inside its fast path when another thread forked left
 * count out of step with its list (each list head is always
 * whole: it is one store). Recount from the links. */
static void recount(kp_tcache *tc) {
    for (unsigned c = 1; c < KP_NUM_CLASSES; c++) {
        uint32_t n = 0;
        for (void *p = tc->lists[c].head; p && _kp_link_ok(p); p = _kp_next(p)) n++;
        KP_STORE(tc->lists[c].count, n);
    }
}

void _kp_tcache_after_fork_child(void) {
    kp_tcache *mine = _kp_tcache_mine();
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
