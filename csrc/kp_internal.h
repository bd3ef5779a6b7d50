/* kp_internal.h: prototypes shared between kpool's layers, grouped by the
 * file that defines them, and the small inline helpers every layer uses.
 *
 * LOCK ORDER (a thread holding one lock may only take locks further down):
 *   0. stats baseline lock      (stats.c: held alone, listed for fork)
 *   1. pool registry lock       (pool.c: slot table of live pools)
 *   2. a pool's lock            (pool.c: its chunks and bounded free list)
 *   3. thread registry lock     (tcache.c: the list of thread caches)
 *   3a. the mesh lock           (mesh.c: one meshing pass at a time)
 *   4. a central class lock     (central.c: one per size class)
 *   5. the page heap lock       (pageheap.c; pagemap writes happen under it)
 *   6. the metadata lock        (os.c: span and cache structs)
 * The thread cache fast path takes no lock at all. fork() takes every lock
 * in this order in the prepare handler (init.c).
 */
#ifndef KP_INTERNAL_H
#define KP_INTERNAL_H

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <time.h>

#include "kp_types.h"
#include "kp_valgrind.h"

/* ---- relaxed counters ---------------------------------------------------
 * Only one thread writes each counter (its owner, or the holder of a lock),
 * so a relaxed load + store is a correct increment and costs a plain move. */
#define KP_LOAD(x) atomic_load_explicit(&(x), memory_order_relaxed)
#define KP_STORE(x, v) atomic_store_explicit(&(x), (v), memory_order_relaxed)
#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
/* One `add` to memory. With a single writer this is exactly the relaxed
 * load + store above (an aligned 4- or 8-byte store is single-copy atomic
 * on x86-64, so readers' relaxed loads see the old or the new value), in one
 * instruction instead of three: gcc does not fold atomic accesses into
 * addressing modes. ThreadSanitizer builds use the C11 form, so the race
 * checker still sees every access as atomic. */
#define KP_BUMP(x, d) do {                                                              \
        if (sizeof(x) == 8) __asm__ volatile("addq %1, %0" : "+m"(x) : "er"((uint64_t)(d)));       \
        else __asm__ volatile("addl %1, %0" : "+m"(x) : "er"((uint32_t)(d)));                     \
    } while (0)
#define KP_DROP(x, d) do {                                                              \
        if (sizeof(x) == 8) __asm__ volatile("subq %1, %0" : "+m"(x) : "er"((uint64_t)(d)));       \
        else __asm__ volatile("subl %1, %0" : "+m"(x) : "er"((uint32_t)(d)));                     \
    } while (0)
#else
#define KP_BUMP(x, d) KP_STORE(x, KP_LOAD(x) + (d))
#define KP_DROP(x, d) KP_STORE(x, KP_LOAD(x) - (d))
#endif
#if KP_STATS
#define KP_STAT_BUMP(x, d) KP_BUMP(x, d)
#define KP_STAT_DROP(x, d) KP_DROP(x, d)
#else
#define KP_STAT_BUMP(x, d) ((void)0)
#define KP_STAT_DROP(x, d) ((void)0)
#endif

#if KP_DEBUG
#define kp_assert(c) ((c) ? (void)0 : _kp_assert_fail(#c, __FILE__, __LINE__))
#else
#define kp_assert(c) ((void)0)
#endif
#if KP_DEBUG >= 2
#define kp_assert_expensive(c) kp_assert(c)
#else
#define kp_assert_expensive(c) ((void)0)
#endif

static inline uint64_t _kp_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline uint64_t _kp_now_coarse_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static inline int _kp_is_pow2(size_t x) { return x != 0 && (x & (x - 1)) == 0; }
static inline size_t _kp_align_up(size_t x, size_t a) { return (x + a - 1) & ~(a - 1); }

/* ---- free-block words -----------------------------------------------------
 * Word 0 of a free small block (and of a free pool block) links it to the
 * next block of its list; word 1 of a free small block holds the free mark.
 * With KP_HARDEN_LINKS the link is stored as next ^ _kp_link_key (a random
 * key drawn at start-up; NULL too is encoded), so a use-after-free write or
 * an overflow into a free block decodes to a wild value, which the next pop
 * sees (a link that is not 16-byte aligned, or not below 2^48) instead of
 * handing out an address an attacker chose. With KP_HARDEN_MARKS a free checks the mark
 * (a double free, however long after the first free) and sets it; a
 * handed-out block has it (and its link) cleared. Only a program that
 * stores that random value in word 1 of a live block would be taken for a
 * double free. */
KP_INTERNAL extern uintptr_t _kp_link_key, _kp_free_mark;   /* written once, in init */

/* Under valgrind (KP_VALGRIND=1) a free block is inaccessible to memcheck:
 * each access below is one that memcheck does not report (kp_valgrind.h). */
static inline void *_kp_next(const void *obj) {
    KP_VG_QUIET_BEGIN();
    uintptr_t v = *(const uintptr_t *)obj;
    KP_VG_QUIET_END();
    return (void *)(KP_HARDEN_LINKS ? v ^ _kp_link_key : v);
}
static inline void _kp_set_next(void *obj, const void *next) {
    KP_VG_QUIET_BEGIN();
    *(uintptr_t *)obj = KP_HARDEN_LINKS ? (uintptr_t)next ^ _kp_link_key : (uintptr_t)next;
    KP_VG_QUIET_END();
}
/* 0 if a decoded link cannot be a block: every block is 16-byte aligned
 * and below 2^48. With the key's top 16 bits neither 0 nor all ones (init),
 * those 20 bits catch every damaged word whose top bits are 0 or all ones
 * (pointers, small integers of either sign, zero) and all but about one in
 * 2^20 other words. */
#define KP_LINK_BAD_BITS (~(((uintptr_t)1 << KP_ADDRESS_BITS) - 1) | (KP_MIN_ALIGN - 1))
static inline int _kp_link_ok(const void *next) { return !KP_HARDEN_LINKS || ((uintptr_t)next & KP_LINK_BAD_BITS) == 0; }
static inline int _kp_is_marked(const void *obj) {
    if (!KP_HARDEN_MARKS) return 0;
    KP_VG_QUIET_BEGIN();
    uintptr_t v = ((const uintptr_t *)obj)[1];
    KP_VG_QUIET_END();
    KP_VG_DEFINED_VALUE(v);
    return v == _kp_free_mark;
}
static inline void _kp_mark_free(void *obj) {
    if (!KP_HARDEN_MARKS) return;
    KP_VG_QUIET_BEGIN();
    ((uintptr_t *)obj)[1] = _kp_free_mark;
    KP_VG_QUIET_END();
}
/* Clears the link as well as the mark: a handed-out block does not show
 * its own encoded link to an uninitialised read, and the one 16-byte store
 * gcc makes of the two measured cheaper than the 8-byte store of the mark
 * alone (random workload, 1 thread: the hardening cost 19% with the 8-byte
 * store, 5% with this; benchmarks/REPORT.md run 8). */
static inline void _kp_mark_live(void *obj) {
    if (!KP_HARDEN_MARKS) return;
    KP_VG_QUIET_BEGIN();
    ((uintptr_t *)obj)[0] = 0;
    ((uintptr_t *)obj)[1] = 0;
    KP_VG_QUIET_END();
}
/* Report a damaged free list (init.c); the caller drops the rest of it. */
KP_INTERNAL void _kp_report_bad_link(const char *call, const void *obj);

/* ---- locks (init.c) ----------------------------------------------------- */
KP_INTERNAL void _kp_lock_init(kp_lock *l);
/* Take l: try first; only a failed try is counted and timed as a wait. */
static inline void _kp_lock(kp_lock *l) {
    if (KP_UNLIKELY(pthread_mutex_trylock(&l->mutex) != 0)) {
        uint64_t t0 = _kp_now_ns();
        pthread_mutex_lock(&l->mutex);
        KP_BUMP(l->contended, 1);
        KP_BUMP(l->wait_ns, _kp_now_ns() - t0);
    }
    KP_BUMP(l->acquires, 1);
}
static inline void _kp_unlock(kp_lock *l) { pthread_mutex_unlock(&l->mutex); }

/* ---- init.c: process setup, fork, errors -------------------------------- */
/* KPOOL_GUARD=N: one allocation in N (that reaches a slow path; thread
 * caches are off in that mode, so every one does) gets a guard page. */
KP_INTERNAL extern unsigned _kp_guard_every;
KP_INTERNAL int _kp_guard_sample(void);   /* 1 if this allocation is guarded */
KP_INTERNAL void _kp_init(void);                   /* idempotent, thread-safe */
/* Install handler for SIGSEGV (SA_SIGINFO, on the alternate stack if any);
 * *prev gets the one it replaces. For KPOOL_GUARD and meshing. */
KP_INTERNAL void _kp_install_segv(void (*handler)(int, siginfo_t *, void *), struct sigaction *prev);
KP_INTERNAL extern _Atomic int _kp_initialized;
KP_INTERNAL void _kp_error(const char *call, const void *ptr, const char *what);
KP_INTERNAL _Noreturn void _kp_assert_fail(const char *cond, const char *file, int line);
/* Random bits drawn once per process (the kernel's AT_RANDOM), for
 * cookies that a program's data must not match by chance. */
KP_INTERNAL extern uint64_t _kp_secret;
static inline uint64_t _kp_mix64(uint64_t x) {   /* splitmix64's finaliser */
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9u;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebu;
    return x ^ (x >> 31);
}

/* ---- os.c: pages from the OS, metadata ---------------------------------- */
KP_INTERNAL size_t _kp_os_page_size(void);
/* Map size bytes aligned to align (a power of two >= OS page); NULL + ENOMEM. */
KP_INTERNAL void *_kp_os_map(size_t size, size_t align);
KP_INTERNAL void _kp_os_unmap(void *p, size_t size);
/* Give pages back; they read as zero afterwards. 0 on success. */
KP_INTERNAL int _kp_os_release(void *p, size_t size);
KP_INTERNAL void _kp_os_hint_huge(void *p, size_t size);
/* Move the pages of [old, old + old_size) to dst, a mapping of new_size
 * bytes that they replace (mremap); the old range is unmapped. 0, or -1
 * with nothing changed. Subject to the test hook. */
KP_INTERNAL int _kp_os_move(void *old, size_t old_size, size_t new_size, void *dst);
KP_INTERNAL int _kp_os_protect_none(void *p, size_t size);   /* 0 on success */
/* Reserve size bytes of zero pages that are charged only when written
 * (MAP_NORESERVE, no huge pages); NULL when the address space is not there.
 * Not subject to the test hook. */
KP_INTERNAL void *_kp_os_reserve(size_t size);
/* Fixed-size metadata structs, zeroed; never unmapped. NULL + ENOMEM. */
KP_INTERNAL void *_kp_meta_alloc(size_t size);
KP_INTERNAL void _kp_meta_free(void *p, size_t size);
KP_INTERNAL size_t _kp_meta_bytes(void);
KP_INTERNAL kp_lock *_kp_meta_lock(void);
KP_INTERNAL void _kp_os_fail_next(int n);     /* test hook: the next n maps fail (ENOMEM) */
KP_INTERNAL void _kp_meta_fail_next(int n);   /* test hook: the next n metadata allocations fail */

/* ---- pagemap.c ------------------------------------------------------------ */
/* Lock-free: the span covering page pn, or NULL. */
static inline kp_span *_kp_pagemap_get(uintptr_t pn);
/* Lock-free: the class byte of address p's page (a small class 1..128, a
 * pool tag, KP_CLASS_LARGE, KP_CLASS_ARENA, or 0 if none). */
static inline unsigned _kp_pagemap_class(const void *p);
static inline unsigned _kp_pagemap_class_flat(const void *p);
/* Reserve the flat class map's window (init, before any span exists). */
KP_INTERNAL void _kp_pagemap_init(void);
/* REQUIRES page heap lock. 0 on success, -1 when a leaf cannot be mapped. */
KP_INTERNAL int _kp_pagemap_ensure(uintptr_t pn, size_t npages);
KP_INTERNAL void _kp_pagemap_set(uintptr_t pn, kp_span *s);
KP_INTERNAL void _kp_pagemap_set_range(uintptr_t pn, size_t npages, kp_span *s);
KP_INTERNAL void _kp_pagemap_set_ends(uintptr_t pn, size_t npages, kp_span *s);   /* first and last page */
KP_INTERNAL size_t _kp_pagemap_bytes(void);   /* bytes mapped for leaves */
KP_INTERNAL void _kp_pagemap_set_class(uintptr_t pn, size_t npages, unsigned cls);
/* The in-use span that contains p (validated against stale entries), or NULL. */
KP_INTERNAL kp_span *_kp_span_of(const void *p);

/* ---- pageheap.c ------------------------------------------------------------ */
KP_INTERNAL void _kp_pageheap_init(void);
KP_INTERNAL kp_lock *_kp_pageheap_lock(void);
/* A span of npages pages in state `state`, every page in the pagemap; NULL + ENOMEM. */
KP_INTERNAL kp_span *_kp_pageheap_alloc(size_t npages, kp_span_state state);
/* Same, its first page aligned to align_pages pages (a power of two). */
KP_INTERNAL kp_span *_kp_pageheap_alloc_aligned(size_t npages, size_t align_pages, kp_span_state state);
KP_INTERNAL void _kp_pageheap_free(kp_span *s);
KP_INTERNAL void _kp_pageheap_free_locked(kp_span *s);   /* REQUIRES page heap lock */
/* Large blocks (heap.c). A LARGE span for `requested` bytes, counted in the
 * large figures; *zeroed says its pages read as zero. NULL + ENOMEM. */
KP_INTERNAL kp_span *_kp_pageheap_large_alloc(size_t npages, size_t align_pages, size_t requested, int *zeroed);
/* REQUIRES page heap lock, s a live LARGE span. */
KP_INTERNAL void _kp_pageheap_large_free_locked(kp_span *s);
KP_INTERNAL void _kp_pageheap_large_requested_locked(kp_span *s, size_t requested);
/* Shrink in place, or grow into the free span after it; 0, or -1 (s unchanged). */
KP_INTERNAL int _kp_pageheap_large_resize_locked(kp_span *s, size_t npages);
/* Move s's pages to a new range of npages pages (mremap: no copy); 0 or -1. */
KP_INTERNAL int _kp_pageheap_large_move_locked(kp_span *s, size_t npages);
/* KPOOL_GUARD: a block of size bytes that ends at an inaccessible page (its
 * span's freelist holds the block's address); NULL + ENOMEM. */
KP_INTERNAL kp_span *_kp_pageheap_guarded_alloc(size_t size, size_t align);
KP_INTERNAL void _kp_pageheap_guarded_free_locked(kp_span *s);   /* REQUIRES page heap lock */
/* Release every free span's pages to the OS; bytes released. */
KP_INTERNAL size_t _kp_pageheap_trim(void);
/* Run the time-based decay if the lock is free (never waits). */
KP_INTERNAL void _kp_pageheap_tick(void);
typedef struct kp_pageheap_figures {
    size_t mapped, released, free_bytes, largest_free, spans_free;
    size_t state_bytes[KP_SPAN_CACHED + 1];  /* bytes of spans by state */
    size_t large_bytes, large_requested;     /* live large blocks */
    uint64_t grows, os_releases, large_allocs, large_frees;
} kp_pageheap_figures;
KP_INTERNAL void _kp_pageheap_figures(kp_pageheap_figures *out);
/* Test hooks: check the free lists and coalescing invariants; 1 if valid. */
KP_INTERNAL int _kp_pageheap_is_valid(void);

/* ---- sizeclass.c ----------------------------------------------------------- */
KP_INTERNAL extern kp_class_info _kp_classes[KP_NUM_CLASSES];
KP_INTERNAL extern uint8_t _kp_class_fine[KP_FINE_MAX / KP_FINE_STEP + 1];
KP_INTERNAL extern uint8_t _kp_class_coarse[KP_SMALL_MAX / KP_COARSE_STEP + 1];
KP_INTERNAL void _kp_sizeclass_init(void);
/* The class for a request of size bytes (size <= KP_SMALL_MAX). */
static inline unsigned _kp_size_class(size_t size) {
    if (KP_LIKELY(size <= KP_FINE_MAX)) return _kp_class_fine[(size + KP_FINE_STEP - 1) / KP_FINE_STEP];
    return _kp_class_coarse[(size + KP_COARSE_STEP - 1) / KP_COARSE_STEP];
}
KP_INTERNAL int _kp_sizeclass_is_valid(void);

/* ---- central.c --------------------------------------------------------------- */
KP_INTERNAL kp_central *_kp_central(unsigned cls);
/* Objects of cls as a NULL-terminated list through their first word:
 * up to n taken one by one, or more (up to room >= n) where a span's whole
 * free list fits; returns the count (0 + ENOMEM when no span could be had). */
KP_INTERNAL unsigned _kp_central_fetch(unsigned cls, unsigned n, unsigned room, void **head);
/* Give back a NULL-terminated list of n objects of class cls. */
KP_INTERNAL void _kp_central_return(unsigned cls, void *head, unsigned n);
/* Empty the transfer slots into the spans (kp_trim). */
KP_INTERNAL void _kp_central_drain(unsigned cls);
KP_INTERNAL int _kp_central_is_valid(unsigned cls);

/* Meshing (central.c picks, mesh.c maps). REQUIRES mesh lock: join up to
 * max_joins sparse spans of cls into others whose live slots they miss, in
 * at most max_rounds rounds of KP_MESH_CANDIDATES spans (the class lock is
 * held throughout), unless the class's spans hold less than min_free bytes
 * free; the number joined. */
KP_INTERNAL unsigned _kp_central_mesh(unsigned cls, unsigned max_joins, size_t min_free, unsigned max_rounds);

/* ---- mesh.c -------------------------------------------------------------------- */
KP_INTERNAL extern int _kp_mesh_on;        /* written once: at init (KPOOL_MESH=1) or by _kp_mesh_start */
KP_INTERNAL void _kp_mesh_init(void);
KP_INTERNAL int _kp_mesh_start(void);       /* turn meshing on; 0, or -1 with errno */
KP_INTERNAL kp_lock *_kp_mesh_lock(void);
/* REQUIRES mesh lock and the class lock. Copy src's live slots (src_live)
 * into dst's page and map that page over src; 0 (the caller moves the
 * accounting), -1 with nothing changed (out of mappings or memory), or -2:
 * nothing changed but dst's free slots where src has live ones were
 * overwritten (the caller rebuilds dst's free list). */
KP_INTERNAL int _kp_mesh_join(kp_span *dst, kp_span *src, const uint64_t *src_live);
/* REQUIRES class lock; p a group's primary with no block out: give every
 * member private pages again and free the aliases to the page heap; 0 (the
 * caller frees p), or -1: some member could not be remapped, the group
 * lives on with p as its primary (its free list must be rebuilt). */
KP_INTERNAL int _kp_mesh_undo(kp_span *p);
enum { KP_MESH_FAIL_FILE, KP_MESH_FAIL_MOVE, KP_MESH_FAIL_ANON };
KP_INTERNAL void _kp_mesh_fail_next(int kind, int n);   /* test hook: the next n remaps of a kind fail */
KP_INTERNAL size_t _kp_mesh_budget(size_t members);   /* test hook: set the mapping budget (0: read it); the previous */
KP_INTERNAL size_t _kp_mesh_all(void);      /* kp_trim: mesh every class; bytes given back */
KP_INTERNAL void _kp_mesh_tick(void);       /* the decay path: a bounded pass, at most every KP_MESH_PERIOD_MS */
KP_INTERNAL void _kp_mesh_fork_prepare(void);   /* takes the mesh lock, makes every group private */
KP_INTERNAL void _kp_mesh_fork_release(void);
KP_INTERNAL void _kp_mesh_fork_child(void);     /* before the locks are released: a memfd of its own */
KP_INTERNAL void _kp_mesh_figures(size_t *bytes_meshed, uint64_t *meshes);
KP_INTERNAL uint64_t _kp_mesh_fault_waits(void);   /* writes that waited for a mesh window */

/* ---- tcache.c ---------------------------------------------------------------- */
/* Every thread's cache pointer starts at (and returns to, at exit) the empty
 * cache: its lists are empty with max 0 and it caches no pool, so the fast
 * paths fall through to the slow ones without testing for NULL. Never written. */
KP_INTERNAL extern kp_tcache _kp_empty_tcache;
KP_INTERNAL extern __thread kp_tcache *_kp_tls_tcache __attribute__((tls_model("initial-exec")));
/* This thread's cache if it has one (NULL before first use and at exit). */
static inline kp_tcache *_kp_tcache_mine(void) {
    kp_tcache *tc = _kp_tls_tcache;
    return tc == &_kp_empty_tcache ? NULL : tc;
}
/* This thread's cache, created on first use; NULL while the thread exits. */
KP_INTERNAL kp_tcache *_kp_tcache_get(void);
KP_INTERNAL void *_kp_tcache_refill(kp_tcache *tc, unsigned cls);   /* one object or NULL */
/* Unlink p, the head of l, checking its link (a damaged one is reported
 * and ends the list). */
KP_INTERNAL void _kp_tcache_pop(kp_tlist *l, void *p);
KP_INTERNAL void _kp_tcache_overflow(kp_tcache *tc, unsigned cls);  /* list too long */
KP_INTERNAL size_t _kp_tcache_budget_cap(void);   /* one thread's byte budget now */
/* 1 if no thread can have a cache (no pthread key could be created). */
KP_INTERNAL int _kp_tcache_disabled(void);
KP_INTERNAL void _kp_tcache_flush_all(kp_tcache *tc);          /* size-class lists */
KP_INTERNAL void _kp_tcache_flush_thread(kp_tcache *tc);       /* lists and pool caches */
/* Count an allocation or free by a thread that has no cache; `sized`: the
 * free told its request size. */
KP_INTERNAL void _kp_tcache_count_uncached(unsigned cls, int is_alloc, int sized, size_t requested);
/* Set by pool.c: gives a thread's pool caches back (flush, thread exit). */
KP_INTERNAL extern void (*_kp_tcache_pool_hook)(kp_tcache *tc);
/* Every thread's counters, exited threads' included. Takes the registry lock. */
KP_INTERNAL void _kp_tcache_totals(kp_tcache_totals *out);
KP_INTERNAL kp_tcache *_kp_registry_next(kp_tcache *tc);  /* REQUIRES registry lock */
KP_INTERNAL void _kp_registry_lock(void);
KP_INTERNAL void _kp_registry_unlock(void);
KP_INTERNAL kp_lock *_kp_registry_lock_ptr(void);
KP_INTERNAL kp_tcache *_kp_registry_first(void);   /* REQUIRES registry lock */
/* Called in the child after fork: drop the caches of threads that are gone. */
KP_INTERNAL void _kp_tcache_after_fork_child(void);

/* ---- heap.c ------------------------------------------------------------------ */
/* Set by a drop-in malloc library: called, instead of the error handler,
 * for a free of a pointer in memory kpool never mapped (another allocator's
 * memory, from before kpool was loaded). */
KP_INTERNAL extern void (*_kp_foreign_free_hook)(void *p);

/* ---- pool.c (for heap.c) --------------------------------------------------- */
/* kp_usable_size of a pointer on a pool chunk's page: the block size at a
 * block start, else 0. */
KP_INTERNAL size_t _kp_pool_usable_size(const void *p);

/* ---- pool.c ------------------------------------------------------------------ */
KP_INTERNAL void _kp_pools_lock_all(void);
KP_INTERNAL void _kp_pools_unlock_all(void);

/* ---- stats.c ----------------------------------------------------------------- */
KP_INTERNAL void _kp_stats_print_at_exit(void);
KP_INTERNAL void _kp_stats_fork_lock(void);
KP_INTERNAL void _kp_stats_fork_unlock(void);

/* ---- pagemap inline bodies ---------------------------------------------------- */
typedef struct kp_pagemap_leaf {
    _Atomic(kp_span *) spans[KP_LEAF_PAGES];
    _Atomic uint8_t classes[KP_LEAF_PAGES];
} kp_pagemap_leaf;
KP_INTERNAL extern _Atomic(kp_pagemap_leaf *) _kp_pagemap_root[(size_t)1 << KP_ROOT_BITS];

static inline kp_span *_kp_pagemap_get(uintptr_t pn) {
    if (KP_UNLIKELY(pn >> KP_PAGEMAP_BITS)) return NULL;
    kp_pagemap_leaf *leaf = atomic_load_explicit(&_kp_pagemap_root[pn >> KP_LEAF_BITS], memory_order_acquire);
    if (KP_UNLIKELY(leaf == NULL)) return NULL;
    return atomic_load_explicit(&leaf->spans[pn & (KP_LEAF_PAGES - 1)], memory_order_acquire);
}

/* The flat class map: one byte per page of a window of `pages` pages from
 * page number `base` (pagemap.c), so kp_free finds a class with one
 * subtraction, one compare and one load instead of a radix walk. pages is
 * 0 until the map is reserved (and stays 0 if it cannot be, or
 * KPOOL_CLASSMAP_PAGES=0): every lookup then takes the radix tree. */
typedef struct kp_classmap {
    _Atomic size_t pages;
    _Atomic uintptr_t base;
    _Atomic(_Atomic(uint8_t) *) bytes;
} kp_classmap;
KP_INTERNAL extern kp_classmap _kp_classmap;
KP_INTERNAL unsigned _kp_pagemap_class_radix(const void *p);

/* The fast paths' lookup: the window's byte, or 0 when p is outside it
 * (then the caller's slow path asks _kp_pagemap_class). */
static inline unsigned _kp_pagemap_class_flat(const void *p) {
    size_t pages = atomic_load_explicit(&_kp_classmap.pages, memory_order_acquire);
    uintptr_t idx = ((uintptr_t)p >> KP_PAGE_SHIFT) - atomic_load_explicit(&_kp_classmap.base, memory_order_relaxed);
    if (KP_LIKELY(idx < pages))
        return atomic_load_explicit(&atomic_load_explicit(&_kp_classmap.bytes, memory_order_relaxed)[idx], memory_order_relaxed);
    return 0;
}

static inline unsigned _kp_pagemap_class(const void *p) {
    size_t pages = atomic_load_explicit(&_kp_classmap.pages, memory_order_acquire);
    uintptr_t idx = ((uintptr_t)p >> KP_PAGE_SHIFT) - atomic_load_explicit(&_kp_classmap.base, memory_order_relaxed);
    if (KP_LIKELY(idx < pages))
        return atomic_load_explicit(&atomic_load_explicit(&_kp_classmap.bytes, memory_order_relaxed)[idx], memory_order_relaxed);
    return _kp_pagemap_class_radix(p);
}

#endif /* KP_INTERNAL_H */
