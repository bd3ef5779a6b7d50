/* pool.c: fixed-size block pools (kp_pool_*).
 *
 * Job: blocks of one size carved on demand from chunks (page-heap spans in
 * state POOL), reused instead of returned. Two modes:
 *  - cached (unbounded pools, while one of KP_POOL_SLOTS slots is free):
 *    each thread keeps a LIFO cache of the pool's free blocks in its kp_tcache
 *    (no lock, no atomic on the fast path). A cache longer than 2 batches
 *    pushes one batch onto the pool's shared stack; an empty cache pops a
 *    batch. The shared stack is a Treiber stack of batch descriptors (pool
 *    metadata, never user memory, never freed before the pool). Its top word
 *    is a 32-bit descriptor index and a 32-bit tag bumped by every push and
 *    pop, so a descriptor popped and pushed again between another thread's
 *    read and its CAS cannot be mistaken for the old top (ABA) unless 2^32
 *    stack operations happen in between.
 *  - locked (bounded pools, or no slot left): one free list under the pool's
 *    lock, so that `capacity` is exact across threads: at most capacity
 *    blocks are live at once.
 * Chunks all have one size per pool. Up to KP_POOL_CHUNK_ALIGNED they are a
 * power of two aligned to their size, so a block's offset in its chunk is
 * p & chunk_mask; their pages carry the class byte KP_CLASS_POOL_SLOT0 +
 * slot for a cached pool, so kp_pool_free validates a pointer with one
 * pagemap byte, a mask and a multiply (no span lookup). Other pools' pages
 * carry KP_CLASS_POOL and are validated through their span.
 * Calls: pageheap (chunks), pagemap (pointer -> chunk), tcache (the caches).
 * Invariants: blocks carved == live + free (caches + shared stack + list);
 *   a block pointer is valid iff its page's class byte is the pool's tag, its
 *   chunk is the pool's (implied by a slot tag; checked through the span for
 *   KP_CLASS_POOL) and its offset is a multiple of block_size below
 *   chunk_limit.
 *   Thread caches name their pool by a never-reused id, so a cache left by a
 *   destroyed pool is recognised and dropped, never used.
 * Locks: the pool registry lock (the list of live pools and the slot table),
 *   then a pool's lock (chunks, locked-mode list, counters of exited
 *   threads), then the registry/central/page heap locks below them.
 */
#include "kp_internal.h"

typedef struct kp_batch {
    _Atomic uint64_t next;          /* top word of the stack below this one */
    void *head;                     /* the blocks, linked through word 0 */
    uint32_t count;
    uint32_t index;                 /* 1-based, its name in stack words */
} kp_batch;

#define DESC_PER_BLOCK 256          /* descriptors are made 256 at a time */
#define DESC_BLOCKS 1024            /* at most 256 Ki descriptors per pool */

struct kp_pool {
    /* read by the fast paths: one cache line */
    uint64_t id;                    /* unique for the process's lifetime */
    int slot;                       /* thread-cache slot, -1 in locked mode */
    unsigned fast_tag;              /* tag if frees take the fast path, else KP_CLASS_NEVER */
    uintptr_t chunk_mask;           /* chunk_bytes - 1 for aligned chunks, else 0 */
    uint64_t chunk_limit;           /* blocks per chunk * block_size */
    uint64_t mod_magic;             /* ceil(2^64 / block_size): divisibility by one multiply */
    uintptr_t cookie;               /* a free block's word 1 holds it (free markers, below) */
    uint32_t cache_max;             /* a thread's cache longer than this pushes a batch */
    uint32_t batch;                 /* blocks per shared batch */
    size_t block_size;              /* rounded up to align */
    /* the rest */
    size_t align;
    size_t capacity;                /* 0 = unbounded */
    unsigned tag;                   /* class byte of its chunks' pages */
    _Atomic uint64_t top;           /* shared stack of full batches: tag << 32 | index */
    _Atomic uint64_t spare;         /* stack of empty descriptors, likewise */
    kp_lock lock;
    kp_span chunks;                 /* sentinel: the pool's chunks */
    char *bump, *bump_end;          /* carving cursor in the newest chunk */
    char *tagged_end;               /* the newest chunk's pages below this carry the tag */
    size_t chunk_bytes;             /* every chunk's size */
    size_t nchunks, mapped;
    void *free_list;                /* locked mode */
    size_t free_count, live, high_water;
    _Atomic uint64_t allocs, frees, misses, carved, exhausted, waits;  /* locked mode and retired caches */
    uint32_t ndesc;                 /* descriptors made (under lock) */
    _Atomic(kp_batch *) desc_blocks[DESC_BLOCKS];   /* written once each, under lock */
    struct kp_pool *list_next, *list_prev;
};
_Static_assert(offsetof(struct kp_pool, block_size) + sizeof(size_t) <= KP_CACHELINE, "the fast paths' fields share a line");

static pthread_mutex_t pools_lock = PTHREAD_MUTEX_INITIALIZER;
static kp_pool pools_list = { .list_next = &pools_list, .list_prev = &pools_list };
static kp_pool *slots[KP_POOL_SLOTS];
static uint64_t next_pool_id = 1;

/* ---- tagged stack ------------------------------------------------------------ */
static kp_batch *desc_at(kp_pool *pool, uint32_t index) {
    kp_batch *block = atomic_load_explicit(&pool->desc_blocks[(index - 1) / DESC_PER_BLOCK], memory_order_acquire);
    return &block[(index - 1) % DESC_PER_BLOCK];
}

static void stack_push(kp_pool *pool, _Atomic uint64_t *top, kp_batch *b) {
    (void)pool;
    uint64_t old = atomic_load_explicit(top, memory_order_relaxed);
    do {
        atomic_store_explicit(&b->next, old, memory_order_relaxed);
    } while (!atomic_compare_exchange_weak_explicit(top, &old, (((old >> 32) + 1) << 32) | b->index,
                                                     memory_order_release, memory_order_relaxed));
}

static kp_batch *stack_pop(kp_pool *pool, _Atomic uint64_t *top) {
    uint64_t old = atomic_load_explicit(top, memory_order_acquire);
    for (;;) {
        uint32_t index = (uint32_t)old;
        if (!index) return NULL;
        kp_batch *b = desc_at(pool, index);
        /* b may be popped and reused meanwhile; its `next` is still an atomic
         * in live metadata, and the tag makes the CAS fail in that case. */
        uint64_t next = atomic_load_explicit(&b->next, memory_order_relaxed);
        uint64_t want = (((old >> 32) + 1) << 32) | (uint32_t)next;
        if (atomic_compare_exchange_weak_explicit(top, &old, want, memory_order_acquire, memory_order_acquire))
            return b;
    }
}

/* An empty descriptor, or NULL + ENOMEM. */
static kp_batch *descriptor_get(kp_pool *pool) {
    kp_batch *b = stack_pop(pool, &pool->spare);
    if (b) return b;
    _kp_lock(&pool->lock);
    uint32_t n = pool->ndesc;
    if (n < DESC_BLOCKS * DESC_PER_BLOCK) {
        kp_batch *block = atomic_load_explicit(&pool->desc_blocks[n / DESC_PER_BLOCK], memory_order_relaxed);
        if (!block) {
            block = _kp_meta_alloc(DESC_PER_BLOCK * sizeof(kp_batch));
            if (block) {
                memset(block, 0, DESC_PER_BLOCK * sizeof(kp_batch));
                atomic_store_explicit(&pool->desc_blocks[n / DESC_PER_BLOCK], block, memory_order_release);
            }
        }
        if (block) {
            b = &block[n % DESC_PER_BLOCK];
            b->index = ++pool->ndesc;
        }
    } else {
        errno = ENOMEM;
    }
    _kp_unlock(&pool->lock);
    return b;
}

/* ---- registry -------------------------------------------------------------------- */

void _kp_pools_lock_all(void) {
    pthread_mutex_lock(&pools_lock);
    for (kp_pool *p = pools_list.list_next; p != &pools_list; p = p->list_next) _kp_lock(&p->lock);
}

void _kp_pools_unlock_all(void) {
    for (kp_pool *p = pools_list.list_prev; p != &pools_list; p = p->list_prev) _kp_unlock(&p->lock);
    pthread_mutex_unlock(&pools_lock);
}

/* ---- chunks and carving ------------------------------------------------------------- */

/* ---- free markers ---------------------------------------------------------------
 * A free block (in a cache, the shared stack or the pool's list, or carved
 * and not yet handed out) holds the pool's cookie in its word 1; handing it
 * out clears the word. A free of a block that holds the cookie is a double
 * free, or a slot never handed out: reported before anything is written.
 * Exact for frees in one thread, or ordered between threads, and always in
 * locked mode (checked under the pool lock); only a user who stores that
 * very value (random, one per pool) in word 1 of a live block is mistaken
 * for a double free. Blocks are at least 16 bytes, so word 1 is the block's.
 * Relaxed atomics: a racing misuse is a wrong answer, never a data race.
 * (Mixing the block's address into the marker cost 2% on pool pairs.) */
static inline void mark_free(const kp_pool *pool, void *p) {
    KP_VG_QUIET_BEGIN();     /* the word of a free block: kp_valgrind.h */
    __atomic_store_n(&((uintptr_t *)p)[1], pool->cookie, __ATOMIC_RELAXED);
    KP_VG_QUIET_END();
}
/* Clears the link too: a handed-out block does not show its own encoded
 * link (the key is the heap's, kp_internal.h) to an uninitialised read. */
static inline void mark_live(void *p) {
    KP_VG_QUIET_BEGIN();
    ((uintptr_t *)p)[0] = 0;
    __atomic_store_n(&((uintptr_t *)p)[1], 0, __ATOMIC_RELAXED);
    KP_VG_QUIET_END();
}
/* Also read from live blocks (kp_pool_owns), whose word 1 may be undefined. */
static inline int is_free(const kp_pool *pool, const void *p) {
    KP_VG_QUIET_BEGIN();
    uintptr_t v = __atomic_load_n(&((const uintptr_t *)p)[1], __ATOMIC_RELAXED);
    KP_VG_QUIET_END();
    KP_VG_DEFINED_VALUE(v);
    return v == pool->cookie;
}

/* Extend the newest chunk's tagged pages to cover [.., end): their class
 * byte becomes the pool's tag and every block starting on them is marked
 * free, so a pointer into a slot never handed out is either on an untagged
 * page (not the pool's) or marked. REQUIRES pool lock. */
static void tag_through(kp_pool *pool, kp_span *s, char *end) {
    char *base = (char *)(s->start << KP_PAGE_SHIFT);
    char *limit = base + s->npages * KP_PAGE_SIZE;
    char *to = (char *)_kp_align_up((uintptr_t)end, KP_PAGE_SIZE);
    if (to > limit) to = limit;
    char *from = pool->tagged_end;
    if (to <= from) return;
    size_t first = ((size_t)(from - base) + pool->block_size - 1) / pool->block_size;
    for (char *q = base + first * pool->block_size; q < to && q < base + pool->chunk_limit; q += pool->block_size)
        mark_free(pool, q);
    _kp_pagemap_set_class((uintptr_t)from >> KP_PAGE_SHIFT, (size_t)(to - from) >> KP_PAGE_SHIFT, pool->tag);
    pool->tagged_end = to;
}

/* Up to `want` contiguous new blocks (at least one), from the current chunk
 * or a new one; *got says how many. Runs keep the blocks of different
 * threads on different cache lines. The blocks are marked free. NULL +
 * ENOMEM. REQUIRES pool lock. */
static char *carve_run(kp_pool *pool, uint32_t want, uint32_t *got) {
    if ((size_t)(pool->bump_end - pool->bump) < pool->block_size) {
        size_t npages = (pool->chunk_bytes + KP_PAGE_SIZE - 1) >> KP_PAGE_SHIFT;
        size_t align = pool->chunk_mask ? pool->chunk_bytes : pool->align;
        size_t align_pages = align > KP_PAGE_SIZE ? align >> KP_PAGE_SHIFT : 1;
        kp_span *s = _kp_pageheap_alloc_aligned(npages, align_pages, KP_SPAN_POOL);
        if (!s) {
            errno = ENOMEM;
            return NULL;
        }
        s->owner = pool;
        s->requested = pool->block_size;
        s->capacity = (uint32_t)(pool->chunk_limit / pool->block_size);
        s->carved = 0;
        s->next = pool->chunks.next;
        s->prev = &pool->chunks;
        pool->chunks.next->prev = s;
        pool->chunks.next = s;
        pool->nchunks++;
        pool->mapped += s->npages * KP_PAGE_SIZE;
        pool->bump = pool->tagged_end = (char *)(s->start << KP_PAGE_SHIFT);
        pool->bump_end = pool->bump + pool->chunk_limit;
    }
    char *p = pool->bump;
    size_t room = (size_t)(pool->bump_end - p) / pool->block_size;
    uint32_t n = want < room ? want : (uint32_t)room;
    pool->bump += (size_t)n * pool->block_size;
    kp_span *s = _kp_pagemap_get((uintptr_t)p >> KP_PAGE_SHIFT);
    s->carved += n;
    KP_BUMP(pool->carved, n);
    tag_through(pool, s, pool->bump);
    *got = n;
    return p;
}

static void release_chunk(kp_pool *pool, kp_span *s) {
    s->prev->next = s->next;
    s->next->prev = s->prev;
    pool->nchunks--;
    pool->mapped -= s->npages * KP_PAGE_SIZE;
    char *base = (char *)(s->start << KP_PAGE_SHIFT);
    if (pool->bump >= base && pool->bump <= base + s->npages * KP_PAGE_SIZE) pool->bump = pool->bump_end = pool->tagged_end = NULL;
    _kp_pageheap_free(s);
}

/* ---- create / destroy ------------------------------------------------------------------ */

kp_pool *kp_pool_create(size_t block_size, size_t align, size_t capacity) {
    _kp_init();
    if (align == 0) align = KP_MIN_ALIGN;
    if (block_size == 0 || block_size > KP_POOL_MAX_BLOCK || !_kp_is_pow2(align) || align > KP_POOL_MAX_ALIGN ||
        capacity > ((size_t)1 << 40)) {
        errno = EINVAL;
        return NULL;
    }
    if (align < KP_MIN_ALIGN) align = KP_MIN_ALIGN;
    kp_pool *pool = _kp_meta_alloc(sizeof(kp_pool));
    if (!pool) return NULL;
    memset(pool, 0, sizeof *pool);
    pool->block_size = _kp_align_up(block_size, align);
    pool->align = align;
    pool->capacity = capacity;
    pool->mod_magic = UINT64_MAX / pool->block_size + 1;
    pool->cookie = (uintptr_t)_kp_mix64(_kp_secret ^ (uintptr_t)pool) | 1;   /* never 0, a live block's mark */
    size_t batch = 65536 / pool->block_size;
    pool->batch = (uint32_t)(batch < 4 ? 4 : batch > 64 ? 64 : batch);
    pool->cache_max = 2 * pool->batch;
    /* A chunk holds at least 16 blocks and 64 KiB, rounded up to a power of
     * two and aligned to it, up to KP_POOL_CHUNK_ALIGNED; blocks of up to a
     * quarter of that get aligned chunks of KP_POOL_CHUNK_ALIGNED (4 or more
     * blocks: their frees take the fast path too); larger blocks get chunks
     * of max(KP_POOL_CHUNK_ALIGNED, one block) found through their span. */
    size_t want = pool->block_size * 16 > KP_POOL_CHUNK_MIN ? pool->block_size * 16 : KP_POOL_CHUNK_MIN;
    if (want < align) want = align;
    if (want > KP_POOL_CHUNK_ALIGNED && pool->block_size * 4 <= KP_POOL_CHUNK_ALIGNED && align <= KP_POOL_CHUNK_ALIGNED)
        want = KP_POOL_CHUNK_ALIGNED;
    if (want <= KP_POOL_CHUNK_ALIGNED) {
        pool->chunk_bytes = KP_POOL_CHUNK_MIN;
        while (pool->chunk_bytes < want) pool->chunk_bytes *= 2;
        pool->chunk_mask = pool->chunk_bytes - 1;
    } else {
        pool->chunk_bytes = pool->block_size > KP_POOL_CHUNK_ALIGNED ? pool->block_size : KP_POOL_CHUNK_ALIGNED;
        pool->chunk_mask = 0;
    }
    size_t chunk_room = _kp_align_up(pool->chunk_bytes, KP_PAGE_SIZE);
    pool->chunk_limit = chunk_room / pool->block_size * pool->block_size;
    pool->chunks.next = pool->chunks.prev = &pool->chunks;
    _kp_lock_init(&pool->lock);
    pool->slot = -1;
    pool->tag = KP_CLASS_POOL;
    pool->fast_tag = KP_CLASS_NEVER;

    pthread_mutex_lock(&pools_lock);
    pool->id = next_pool_id++;
    if (capacity == 0) {
        for (int i = 0; i < KP_POOL_SLOTS; i++) {
            if (!slots[i]) {
                slots[i] = pool;
                pool->slot = i;
                if (pool->chunk_mask) pool->tag = pool->fast_tag = KP_CLASS_POOL_SLOT0 + (unsigned)i;
                break;
            }
        }
    }
    pool->list_next = pools_list.list_next;
    pool->list_prev = &pools_list;
    pools_list.list_next->list_prev = pool;
    pools_list.list_next = pool;
    pthread_mutex_unlock(&pools_lock);
    KP_VG(VALGRIND_CREATE_MEMPOOL(pool, 0, 0));     /* kp_valgrind.h */
    return pool;
}

static void sum_caches(kp_pool *pool, uint64_t *allocs, uint64_t *frees, uint64_t *misses, size_t *cached);
static size_t live_now(kp_pool *pool, uint64_t allocs, uint64_t frees);

void kp_pool_destroy(kp_pool *pool) {
    if (!pool) return;
    KP_VG(VALGRIND_DESTROY_MEMPOOL(pool));          /* its live blocks too, before the chunks go */
    pthread_mutex_lock(&pools_lock);
    if (pool->slot >= 0) slots[pool->slot] = NULL;
    pool->list_prev->list_next = pool->list_next;
    pool->list_next->list_prev = pool->list_prev;
    pthread_mutex_unlock(&pools_lock);
#if KP_DEBUG
    {
        uint64_t a, f, m;
        size_t cached;
        _kp_lock(&pool->lock);
        sum_caches(pool, &a, &f, &m, &cached);
        _kp_unlock(&pool->lock);
        if (a != f) _kp_error("kp_pool_destroy", pool, "pool still has live blocks");
    }
#endif
    while (pool->chunks.next != &pool->chunks) release_chunk(pool, pool->chunks.next);
    for (int i = 0; i < DESC_BLOCKS; i++) {
        kp_batch *block = atomic_load_explicit(&pool->desc_blocks[i], memory_order_relaxed);
        if (!block) break;
        _kp_meta_free(block, DESC_PER_BLOCK * sizeof(kp_batch));
    }
    pthread_mutex_destroy(&pool->lock.mutex);
    _kp_meta_free(pool, sizeof(kp_pool));
}

/* ---- validation ------------------------------------------------------------------------ */

/* 1 if an offset in a chunk is a block boundary: Lemire's divisibility test,
 * exact for offsets below 2^32 (chunks are at most 2^30 + a page). */
static inline __attribute__((always_inline)) int block_offset_ok(const kp_pool *pool, uint64_t off) {
    return off < pool->chunk_limit && pool->mod_magic * off < pool->mod_magic;
}

/* 1 if p lies at a block boundary inside one of pool's chunks. Lock-free:
 * the class byte names the pool's chunks, and a chunk's fields do not
 * change while it has a live block. */
static int block_ok(const kp_pool *pool, const void *p) {
    unsigned tag = _kp_pagemap_class(p);
    if (tag != pool->tag) return 0;
    uint64_t off = (uintptr_t)p & pool->chunk_mask;
    if (tag == KP_CLASS_POOL) {      /* shared by every pool without a slot tag */
        kp_span *s = _kp_pagemap_get((uintptr_t)p >> KP_PAGE_SHIFT);
        if (!s || s->owner != pool) return 0;
        if (!pool->chunk_mask) off = (uintptr_t)p - (s->start << KP_PAGE_SHIFT);
    }
    return block_offset_ok(pool, off);
}

size_t _kp_pool_usable_size(const void *p) {
    kp_span *s = _kp_pagemap_get((uintptr_t)p >> KP_PAGE_SHIFT);   /* every page of a chunk maps to it */
    if (!s || s->state != KP_SPAN_POOL || !s->owner) return 0;
    kp_pool *pool = s->owner;
    return block_ok(pool, p) && !is_free(pool, p) ? pool->block_size : 0;
}

static __attribute__((noinline)) void report_not_live(void *p) {
    _kp_error("kp_pool_free", p, "double free, or a block never handed out (block is not live)");
}

static __attribute__((noinline)) void report_bad_free(kp_pool *pool, void *p) {
    if (kp_owns(p)) _kp_error("kp_pool_free", p, "pointer is not a block of this pool");
    else _kp_error("kp_pool_free", p, "pointer was not allocated by kpool");
    (void)pool;
}

/* Take the head of a list; a damaged link (kp_internal.h) is reported and
 * ends the list, and *damaged says so. */
static void *pop_checked(void **head, int *damaged) {
    void *p = *head, *next = _kp_next(p);
    *damaged = !_kp_link_ok(next);
    if (*damaged) {
        _kp_report_bad_link("kp_pool_alloc", p);
        next = NULL;
    }
    *head = next;
    return p;
}

/* Put free block p on the pool's own list. REQUIRES pool lock. */
static void free_list_push(kp_pool *pool, void *p) {
    mark_free(pool, p);
    _kp_set_next(p, pool->free_list);
    pool->free_list = p;
    pool->free_count++;
}

/* Move a thread cache's unused fresh blocks to the pool's list. REQUIRES
 * pool lock. */
static void give_fresh(kp_pool *pool, kp_pool_cache *pc) {
    for (; pc->fresh < pc->fresh_end; pc->fresh += pool->block_size) free_list_push(pool, pc->fresh);
}

/* ---- locked mode ------------------------------------------------------------------------ */

static __attribute__((noinline)) void *locked_alloc(kp_pool *pool) {
    _kp_lock(&pool->lock);
    void *p = pool->free_list;
    if (p) {
        int damaged;
        pop_checked(&pool->free_list, &damaged);
        pool->free_count = damaged ? 0 : pool->free_count - 1;
    } else if (pool->capacity && pool->live >= pool->capacity) {
        KP_BUMP(pool->exhausted, 1);
        _kp_unlock(&pool->lock);
        errno = ENOBUFS;
        return NULL;
    } else {
        uint32_t got;
        p = carve_run(pool, 1, &got);
        if (!p) {
            _kp_unlock(&pool->lock);
            return NULL;
        }
        KP_BUMP(pool->misses, 1);
    }
    mark_live(p);
    pool->live++;
    if (pool->live > pool->high_water) pool->high_water = pool->live;
    KP_BUMP(pool->allocs, 1);
    _kp_unlock(&pool->lock);
    return p;
}

static __attribute__((noinline)) void locked_free(kp_pool *pool, void *p) {
    _kp_lock(&pool->lock);
    if (is_free(pool, p) || pool->live == 0) {
        _kp_unlock(&pool->lock);
        report_not_live(p);
        return;
    }
    free_list_push(pool, p);
    pool->live--;
    KP_BUMP(pool->frees, 1);
    _kp_unlock(&pool->lock);
}

/* ---- cached mode --------------------------------------------------------------------------- */

static __attribute__((noinline)) void claim_cache(kp_pool_cache *pc, uint64_t id) {
    pc->head = NULL;
    KP_STORE(pc->count, 0);
    KP_STORE(pc->allocs, 0);
    KP_STORE(pc->misses, 0);
    KP_STORE(pc->moved, 0);
    pc->fresh = pc->fresh_end = NULL;
    KP_STORE(pc->pool_id, id);
}

/* The frees a cache has seen (kp_types.h: they are not counted one by one). */
static uint64_t cache_frees(kp_pool_cache *pc) {
    return KP_LOAD(pc->allocs) - KP_LOAD(pc->misses) + KP_LOAD(pc->count) - KP_LOAD(pc->moved);
}

/* This thread's cache for pool, claimed if its slot held a dead pool's. */
static inline kp_pool_cache *cache_of(kp_tcache *tc, kp_pool *pool) {
    kp_pool_cache *pc = &tc->pools[pool->slot];
    if (KP_UNLIKELY(KP_LOAD(pc->pool_id) != pool->id)) claim_cache(pc, pool->id);
    return pc;
}

/* Move the first n blocks of pc onto the shared stack; -1 if no descriptor. */
static __attribute__((noinline)) int push_batch(kp_pool *pool, kp_pool_cache *pc, uint32_t n) {
    kp_batch *b = descriptor_get(pool);
    if (!b) return -1;
    void *head = pc->head, *last = head;
    uint32_t i = 1;
    for (; i < n; i++) {
        void *next = _kp_next(last);
        if (!next || !_kp_link_ok(next)) break;
        last = next;
    }
    void *rest = _kp_next(last);
    if (!_kp_link_ok(rest)) {
        _kp_report_bad_link("kp_pool_free", last);
        rest = NULL;
        KP_STORE(pc->count, i);
    }
    n = i;
    pc->head = rest;
    _kp_set_next(last, NULL);
    KP_STORE(pc->count, KP_LOAD(pc->count) - n);
    KP_DROP(pc->moved, n);
    b->head = head;
    b->count = n;
    stack_push(pool, &pool->top, b);
    return 0;
}

/* Cached mode keeps no live count; when a block is carved (live is near its
 * peak then) the caches are summed. REQUIRES pool lock. */
static void note_high_water(kp_pool *pool, size_t pending) {
    uint64_t allocs, frees, misses;
    size_t cached;
    sum_caches(pool, &allocs, &frees, &misses, &cached);
    size_t live = live_now(pool, allocs + pending, frees);
    if (live > pool->high_water) pool->high_water = live;
}

static __attribute__((noinline)) void *cached_alloc_slow(kp_pool *pool) {
    kp_tcache *tc = _kp_tcache_get();
    if (!tc) return locked_alloc(pool);
    kp_pool_cache *pc = cache_of(tc, pool);
    void *p = pc->head;
    if (!p) {
        kp_batch *b = stack_pop(pool, &pool->top);
        if (b) {
            pc->head = b->head;
            KP_STORE(pc->count, b->count);
            KP_BUMP(pc->moved, b->count);
            stack_push(pool, &pool->spare, b);
            p = pc->head;
        }
    }
    if (p) {
        int damaged;
        pop_checked(&pc->head, &damaged);
        KP_STORE(pc->count, damaged ? 0 : KP_LOAD(pc->count) - 1);
    } else if (pc->fresh < pc->fresh_end) {
        p = pc->fresh;
        pc->fresh += pool->block_size;
        KP_BUMP(pc->misses, 1);
    } else {
        _kp_lock(&pool->lock);
        p = pool->free_list;     /* blocks left by threads without a cache */
        if (p) {
            int damaged;
            pop_checked(&pool->free_list, &damaged);
            pool->free_count = damaged ? 0 : pool->free_count - 1;
            KP_BUMP(pc->moved, 1);   /* as if it came through the cache's list */
        } else {
            uint32_t got = 0;
            char *run = carve_run(pool, pool->batch, &got);
            if (run) {
                p = run;
                pc->fresh = run + pool->block_size;
                pc->fresh_end = run + (size_t)got * pool->block_size;
                note_high_water(pool, 1);    /* before the miss is counted: frees are derived from it */
                KP_BUMP(pc->misses, 1);
            }
        }
        _kp_unlock(&pool->lock);
        if (!p) return NULL;
    }
    mark_live(p);
    KP_BUMP(pc->allocs, 1);
    return p;
}

static inline __attribute__((always_inline)) void *pool_alloc(kp_pool *pool) {
    if (KP_UNLIKELY(!pool)) {
        errno = EINVAL;
        return NULL;
    }
    if (pool->slot < 0) return locked_alloc(pool);
    kp_pool_cache *pc = &_kp_tls_tcache->pools[pool->slot];   /* the empty cache's slots are unused */
    void *p = pc->head;
    if (KP_LIKELY(p != NULL && KP_LOAD(pc->pool_id) == pool->id)) {
        void *next = _kp_next(p);
        if (KP_UNLIKELY(!_kp_link_ok(next))) return cached_alloc_slow(pool);   /* reports it */
        pc->head = next;
        mark_live(p);
        KP_BUMP(pc->count, -1);
        KP_BUMP(pc->allocs, 1);
        return p;
    }
    return cached_alloc_slow(pool);
}

void *kp_pool_alloc(kp_pool *pool) {
    void *p = pool_alloc(pool);
    KP_VG(if (p) VALGRIND_MEMPOOL_ALLOC(pool, p, pool->block_size));
    return p;
}

static inline __attribute__((always_inline)) void cached_push(kp_pool *pool, kp_pool_cache *pc, void *p) {
    mark_free(pool, p);
    _kp_set_next(p, pc->head);
    pc->head = p;
    uint32_t n = KP_LOAD(pc->count) + 1;
    KP_STORE(pc->count, n);
    if (KP_UNLIKELY(n > pool->cache_max)) (void)push_batch(pool, pc, pool->batch);
}

/* Everything but the common case: bad pointers, locked mode, a thread
 * without a cache yet, a cache slot left by a destroyed pool, double frees. */
static __attribute__((noinline)) void pool_free_slow(kp_pool *pool, void *p) {
    if (!p) return;
    if (!pool || !block_ok(pool, p)) {
        report_bad_free(pool, p);
        return;
    }
    if (pool->slot < 0) {
        locked_free(pool, p);
        return;
    }
    kp_tcache *tc = _kp_tcache_get();
    if (!tc) {                     /* thread exiting: the pool's own list */
        _kp_lock(&pool->lock);
        int not_live = is_free(pool, p);
        if (!not_live) {
            free_list_push(pool, p);
            KP_BUMP(pool->frees, 1);
        }
        _kp_unlock(&pool->lock);
        if (not_live) report_not_live(p);
        return;
    }
    if (is_free(pool, p)) {
        report_not_live(p);
        return;
    }
    cached_push(pool, cache_of(tc, pool), p);
}

void kp_pool_free(kp_pool *pool, void *p) {
    KP_VG(if (pool && p) VALGRIND_MEMPOOL_FREE(pool, p));   /* before any other thread can get it */
    if (KP_LIKELY(pool != NULL)) {
        /* A slot tag on p's page says: a chunk of the cached pool in that
         * slot (NULL and foreign pointers have other bytes). */
        unsigned tag = _kp_pagemap_class_flat(p);
        if (KP_LIKELY(tag == pool->fast_tag && block_offset_ok(pool, (uintptr_t)p & pool->chunk_mask))) {
            kp_pool_cache *pc = &_kp_tls_tcache->pools[tag - KP_CLASS_POOL_SLOT0];
            if (KP_LIKELY(KP_LOAD(pc->pool_id) == pool->id && !is_free(pool, p))) {
                cached_push(pool, pc, p);
                return;
            }
        }
    }
    pool_free_slow(pool, p);
}

/* Give a thread's caches back to their pools (thread exit, kp_thread_flush).
 * Called by the cache's owner (or in a forked child). */
void _kp_pool_thread_flush(kp_tcache *tc) {
    pthread_mutex_lock(&pools_lock);
    for (int i = 0; i < KP_POOL_SLOTS; i++) {
        kp_pool_cache *pc = &tc->pools[i];
        uint64_t id = KP_LOAD(pc->pool_id);
        if (!id) continue;
        kp_pool *pool = slots[i];
        if (pool && pool->id == id) {
            _kp_lock(&pool->lock);
            KP_BUMP(pool->allocs, KP_LOAD(pc->allocs));
            KP_BUMP(pool->frees, cache_frees(pc));
            KP_BUMP(pool->misses, KP_LOAD(pc->misses));
            KP_STORE(pc->pool_id, 0);
            give_fresh(pool, pc);
            for (void *p = pc->head, *next; p && _kp_link_ok(p); p = next) {
                next = _kp_next(p);
                free_list_push(pool, p);
            }
            _kp_unlock(&pool->lock);
        }
        KP_STORE(pc->pool_id, 0);
        pc->head = NULL;
        pc->fresh = pc->fresh_end = NULL;
        KP_STORE(pc->count, 0);
    }
    pthread_mutex_unlock(&pools_lock);
}

/* ---- statistics and queries ------------------------------------------------------------------ */

/* Sum the live threads' caches of pool. REQUIRES pool lock. */
static void sum_caches(kp_pool *pool, uint64_t *allocs, uint64_t *frees, uint64_t *misses, size_t *cached) {
    *allocs = KP_LOAD(pool->allocs);
    *frees = KP_LOAD(pool->frees);
    *misses = KP_LOAD(pool->misses);
    *cached = 0;
    if (pool->slot < 0) return;
    _kp_registry_lock();
    for (kp_tcache *tc = _kp_registry_first(); tc; tc = _kp_registry_next(tc)) {
        kp_pool_cache *pc = &tc->pools[pool->slot];
        if (KP_LOAD(pc->pool_id) != pool->id) continue;
        *allocs += KP_LOAD(pc->allocs);
        *frees += cache_frees(pc);
        *misses += KP_LOAD(pc->misses);
        *cached += KP_LOAD(pc->count);
    }
    _kp_registry_unlock();
}

/* Blocks live now, from counters that other threads move while they are
 * summed (a block freed by another thread than its allocator can be seen
 * freed and not yet allocated): never below 0 nor above the blocks ever
 * carved. REQUIRES pool lock. */
static size_t live_now(kp_pool *pool, uint64_t allocs, uint64_t frees) {
    if (pool->slot < 0) return pool->live;
    uint64_t carved = KP_LOAD(pool->carved);
    uint64_t live = allocs > frees ? allocs - frees : 0;
    return (size_t)(live < carved ? live : carved);
}

int kp_pool_stats_get(kp_pool *pool, kp_pool_stats *user) {
    if (!pool || !user || user->struct_size < offsetof(kp_pool_stats, free_blocks)) {
        errno = EINVAL;
        return -1;
    }
    kp_pool_stats st = { .struct_size = user->struct_size }, *out = &st;
    uint64_t allocs, frees, misses;
    size_t cached, carved_held = 0;
    _kp_lock(&pool->lock);
    for (kp_span *s = pool->chunks.next; s != &pool->chunks; s = s->next) carved_held += s->carved;
    sum_caches(pool, &allocs, &frees, &misses, &cached);
    size_t live = live_now(pool, allocs, frees);
    if (live > pool->high_water) pool->high_water = live;
    out->allocs = allocs;
    out->frees = frees;
    out->misses = misses;
    out->hits = allocs > misses ? allocs - misses : 0;
    out->exhausted = KP_LOAD(pool->exhausted);
    out->capacity_waits = KP_LOAD(pool->waits);
    out->live = live;
    out->high_water = pool->high_water;
    out->capacity = pool->capacity;
    out->block_size = pool->block_size;
    out->bytes_mapped = pool->mapped;
    out->chunks = pool->nchunks;
    out->free_blocks = carved_held > live ? carved_held - live : 0;
    _kp_unlock(&pool->lock);
    memcpy(user, &st, user->struct_size < sizeof st ? user->struct_size : sizeof st);
    return 0;
}

void kp_pool_note_wait(kp_pool *pool) {
    if (!pool) return;
    _kp_lock(&pool->lock);
    KP_BUMP(pool->waits, 1);
    _kp_unlock(&pool->lock);
}

size_t kp_pool_block_size(const kp_pool *pool) { return pool ? pool->block_size : 0; }

int kp_pool_owns(kp_pool *pool, const void *p) {
    if (!pool || !p || !block_ok(pool, p)) return 0;
    if (pool->slot >= 0) return !is_free(pool, p);
    _kp_lock(&pool->lock);            /* locked mode: exact against frees racing with this call */
    int live = !is_free(pool, p);
    _kp_unlock(&pool->lock);
    return live;
}

/* Release the chunks none of whose blocks is live. Free blocks reachable
 * here: the locked list, this thread's cache and the shared stack; blocks
 * in other threads' caches keep their chunks. */
size_t kp_pool_trim(kp_pool *pool) {
    if (!pool) return 0;
    kp_tcache *tc = _kp_tcache_mine();
    if (pool->slot >= 0 && tc) {
        kp_pool_cache *pc = cache_of(tc, pool);
        while (KP_LOAD(pc->count) > 0) {
            uint32_t n = KP_LOAD(pc->count);
            if (push_batch(pool, pc, n > pool->batch ? pool->batch : n) != 0) break;
        }
    }
    _kp_lock(&pool->lock);
    if (pool->slot >= 0 && tc && KP_LOAD(tc->pools[pool->slot].pool_id) == pool->id) {
        give_fresh(pool, &tc->pools[pool->slot]);
    }
    for (kp_batch *b; pool->slot >= 0 && (b = stack_pop(pool, &pool->top)) != NULL;) {
        for (void *p = b->head, *next; p && _kp_link_ok(p); p = next) {
            next = _kp_next(p);
            free_list_push(pool, p);
        }
        b->head = NULL;
        stack_push(pool, &pool->spare, b);
    }
    /* count free blocks per chunk in span->allocated (unused for chunks) */
    for (kp_span *s = pool->chunks.next; s != &pool->chunks; s = s->next) s->allocated = 0;
    size_t listed = 0;
    for (void *p = pool->free_list; p && _kp_link_ok(p) && listed <= pool->free_count; p = _kp_next(p), listed++)
        _kp_pagemap_get((uintptr_t)p >> KP_PAGE_SHIFT)->allocated++;
    size_t released = 0;
    if (listed != pool->free_count) {     /* a list damaged by a racing misuse: keep every chunk */
        _kp_unlock(&pool->lock);
        _kp_error("kp_pool_trim", pool, "the pool's free list is damaged (blocks freed twice at once?)");
        return 0;
    }
    for (void *p = pool->free_list, *prev = NULL, *next; p; p = next) {
        next = _kp_next(p);
        kp_span *s = _kp_pagemap_get((uintptr_t)p >> KP_PAGE_SHIFT);
        if (s->allocated == s->carved) {     /* drop from the list; its chunk goes */
            if (prev) _kp_set_next(prev, next);
            else pool->free_list = next;
            pool->free_count--;
        } else {
            prev = p;
        }
    }
    for (kp_span *s = pool->chunks.next; s != &pool->chunks;) {
        kp_span *next = s->next;
        if (s->allocated == s->carved) {
            released += s->npages * KP_PAGE_SIZE;
            release_chunk(pool, s);
        }
        s = next;
    }
    _kp_unlock(&pool->lock);
    return released;
}
