/* heap.c: kp_malloc, kp_free and friends: the fast path that ties the
 * layers together.
 *
 * Job: a request of at most KP_SMALL_MAX bytes is rounded to its class and
 * popped from this thread's cache (tcache.c) with no lock and no atomic
 * read-modify-write; a free pushes the block back after one pagemap read
 * (the page's class byte). Larger requests are spans of their own from the
 * page heap. Misuse that can be seen cheaply goes to the error handler:
 * pointers kpool never gave out, a freed large block, and (KP_HARDEN) every
 * double free of a small block by its free mark and a damaged free-list
 * link at the pop that would follow it (kp_internal.h: free-block words); a
 * KP_DEBUG build also checks interior pointers (a live bit per object).
 * Calls: tcache, central (threads whose cache is gone), pageheap, pagemap.
 * Invariants: a block is in exactly one place: a user's hands, one thread
 *   list, or one span's free list. kp_realloc(p, 0) frees p and returns the
 *   unique pointer kp_malloc(0) gives.
 * Locks: none on the fast path; large blocks and untrusted pointers take
 *   the page heap lock (lookups are validated under it).
 */
#include "kp_internal.h"

/* ---- valgrind (KP_VALGRIND=1; kp_valgrind.h) ------------------------------------- */
#if KP_VALGRIND
#include <sys/mman.h>

/* A block kpool hands out, of its usable size; zeroed: it reads as zero. */
static void vg_alloc(void *p, int zeroed) {
    if (p) VALGRIND_MALLOCLIKE_BLOCK(p, kp_usable_size(p), 0, zeroed);
}
/* Only for memory kpool mapped: a foreign pointer (another allocator's
 * block) goes to kpool's error handler alone, and memcheck's record of it
 * stays. */
static void vg_free(void *p) {
    if (p && kp_owns(p)) VALGRIND_FREELIKE_BLOCK(p, 0);
}
/* Large block p of old_usable bytes is now at `at`, of `usable` bytes: resized
 * in place, or moved by mremap (which moved memcheck's shadow state with the
 * pages, but not the block record). REQUIRES page heap lock: a tail given
 * back, or the old address range, cannot be another thread's block yet. */
static void vg_large_resized(void *p, size_t old_usable, void *at, size_t usable) {
    if (at == p) {
        if (usable != old_usable) VALGRIND_RESIZEINPLACE_BLOCK(p, old_usable, usable, 0);
        return;
    }
    /* The old range is unmapped: its record goes first, so that the buffer
     * for the bits (which may be mapped there now) is not marked with it. */
    VALGRIND_FREELIKE_BLOCK(p, 0);
    size_t n = old_usable < usable ? old_usable : usable;
    void *bits = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    int saved = bits != MAP_FAILED && VALGRIND_GET_VBITS(at, bits, n) == 1;
    VALGRIND_MALLOCLIKE_BLOCK(at, usable, 0, 0);
    if (!saved || VALGRIND_SET_VBITS(at, bits, n) != 1) VALGRIND_MAKE_MEM_DEFINED(at, n);
    if (bits != MAP_FAILED) munmap(bits, n);
}
static void *vg_alloced(void *p) {
    KP_VG(vg_alloc(p, 0));
    return p;
}
#define VG_ALLOCED(p) vg_alloced(p)    /* a block handed out, registered */
#else
#define VG_ALLOCED(p) (p)
#endif

/* ---- debug live bits --------------------------------------------------------- */
#if KP_DEBUG
enum { DEBUG_FREE, DEBUG_ALLOC, DEBUG_CHECK };
/* DEBUG_ALLOC sets p's live bit, DEBUG_FREE clears it, DEBUG_CHECK only
 * reads it; -1 (reported) if p is not a block's start, or not live for a
 * free or a check. */
static int debug_mark(void *p, int op, const char *call) {
    kp_span *s = _kp_pagemap_get((uintptr_t)p >> KP_PAGE_SHIFT);
    size_t off = (uintptr_t)p - (s->start << KP_PAGE_SHIFT);
    size_t size = _kp_classes[s->sizeclass].size;
    if (off % size) {
        _kp_error(call, p, "pointer is inside a block, not its start");
        return -1;
    }
    size_t idx = off / size;
    uint64_t bit = (uint64_t)1 << (idx % 64);
    if (op == DEBUG_ALLOC) {
        atomic_fetch_or(&s->live_bits[idx / 64], bit);
        return 0;
    }
    uint64_t was = op == DEBUG_FREE ? atomic_fetch_and(&s->live_bits[idx / 64], ~bit)
                                    : atomic_load(&s->live_bits[idx / 64]);
    if (!(was & bit)) {
        _kp_error(call, p, op == DEBUG_FREE ? "double free (block is not live)" : "pointer is not a live block");
        return -1;
    }
    return 0;
}
#define DEBUG_MARK(p, op, call) debug_mark(p, op, call)
#else
#define DEBUG_MARK(p, op, call) 0
#endif

/* ---- small blocks ---------------------------------------------------------------- */

/* One object of cls for a thread without a cache (exiting, or its cache
 * could not be made). */
static void *uncached_alloc(unsigned cls, size_t size) {
    void *head;
    if (_kp_central_fetch(cls, 1, 1, &head) == 0) return NULL;
    _kp_tcache_count_uncached(cls, 1, 1, size);
    return head;
}

/* A KPOOL_GUARD block: it ends at an inaccessible page. */
static void *guarded_alloc(size_t size, size_t align) {
    kp_span *s = _kp_pageheap_guarded_alloc(size, align);
    if (!s) errno = ENOMEM;
    return s ? s->freelist : NULL;
}

static void *small_alloc_slow(unsigned cls, size_t size) {
    if (KP_UNLIKELY(cls == 0)) {
        /* The class tables are all zero until kpool is initialised: this is
         * a call before kpool's constructor (another library's constructor,
         * a C++ static initialiser, a preloaded malloc's first caller). */
        _kp_init();
        cls = _kp_size_class(size);
    }
    if (KP_UNLIKELY(_kp_guard_every) && _kp_guard_sample()) {
        /* the class's own alignment (kp_aligned_alloc picks classes by it) */
        size_t csize = _kp_classes[cls].size, align = csize & -csize;
        return guarded_alloc(size, align < KP_PAGE_SIZE ? align : KP_PAGE_SIZE);
    }
    kp_tcache *tc = _kp_tcache_get();
    void *p;
    if (!tc) {
        p = uncached_alloc(cls, size);
    } else {
        kp_tlist *l = &tc->lists[cls];
        p = l->head;
        if (p) {
            _kp_tcache_pop(l, p);
        } else {
            p = _kp_tcache_refill(tc, cls);
        }
        if (p) {
            KP_STAT_BUMP(l->allocs, 1);
            KP_STAT_BUMP(l->requested, size);
        }
    }
    if (!p) {
        errno = ENOMEM;
        return NULL;
    }
    _kp_mark_live(p);
    (void)DEBUG_MARK(p, DEBUG_ALLOC, "kp_malloc");
    return p;
}

/* The empty cache's lists have no head, so a thread without a cache takes
 * the slow path here. */
static inline __attribute__((always_inline)) void *small_alloc(unsigned cls, size_t size) {
    kp_tlist *l = &_kp_tls_tcache->lists[cls];
    void *p = l->head;
    if (KP_LIKELY(p != NULL)) {
        void *next = _kp_next(p);
        if (KP_UNLIKELY(!_kp_link_ok(next))) return small_alloc_slow(cls, size);   /* reports it */
        l->head = next;
        _kp_mark_live(p);
        KP_BUMP(l->count, -1);
        KP_STAT_BUMP(l->allocs, 1);
        KP_STAT_BUMP(l->requested, size);
        if (KP_DEBUG) (void)DEBUG_MARK(p, DEBUG_ALLOC, "kp_malloc");
        return p;
    }
    return small_alloc_slow(cls, size);
}

/* Push p (class cls) on list l of tc; `sized` (a constant at every call)
 * says whether `requested` holds the size asked for p. */
static inline __attribute__((always_inline)) void small_push(kp_tcache *tc, kp_tlist *l, void *p, unsigned cls,
                                                             int sized, size_t requested, const char *call) {
    void *head = l->head;
    if (KP_HARDEN_MARKS ? KP_UNLIKELY(_kp_is_marked(p)) : KP_UNLIKELY(head == p)) {
        _kp_error(call, p, KP_HARDEN_MARKS ? "double free (the block is already free)"
                                           : "double free (block is already at the head of this thread's free list)");
        return;
    }
    _kp_mark_free(p);
    _kp_set_next(p, head);
    l->head = p;
    KP_BUMP(l->count, 1);
    (void)tc, (void)cls, (void)requested;   /* unused without KP_STATS */
    if (sized) KP_STAT_DROP(l->requested, requested);
    else KP_STAT_BUMP(tc->moves[cls].unsized_frees, 1);
}

/* A free to a full list, or by a thread whose cache does not exist yet (or
 * any more). */
/* The slow paths of a free may reach mmap, madvise or pthread_setspecific;
 * kp_free keeps errno (glibc's free does since 2.33), so they restore it. */
static __attribute__((noinline)) void small_free_slow(void *p, unsigned cls, int sized, size_t requested,
                                                      const char *call) {
    int saved_errno = errno;
    kp_tcache *tc = _kp_tcache_get();
    if (tc) {
        small_push(tc, &tc->lists[cls], p, cls, sized, requested, call);
        if (KP_LOAD(tc->lists[cls].count) > tc->lists[cls].max) _kp_tcache_overflow(tc, cls);
    } else if (_kp_is_marked(p)) {
        _kp_error(call, p, "double free (the block is already free)");
    } else {
        _kp_mark_free(p);
        _kp_set_next(p, NULL);
        _kp_central_return(cls, p, 1);
        _kp_tcache_count_uncached(cls, 0, sized, requested);
    }
    errno = saved_errno;
}

/* A full list (the empty cache's lists are full: max 0) goes to the slow
 * path before anything is written. */
static inline __attribute__((always_inline)) void small_free(void *p, unsigned cls, int sized, size_t requested,
                                                             const char *call) {
    if (KP_DEBUG && sized && requested > _kp_classes[cls].size) {
        _kp_error(call, p, "size is larger than the block");
        return;
    }
    if (KP_DEBUG && DEBUG_MARK(p, DEBUG_FREE, call) != 0) return;
    kp_tcache *tc = _kp_tls_tcache;
    kp_tlist *l = &tc->lists[cls];
    if (KP_UNLIKELY(KP_LOAD(l->count) >= l->max)) {
        small_free_slow(p, cls, sized, requested, call);
        return;
    }
    small_push(tc, l, p, cls, sized, requested, call);
}

static inline int small_class_ok(unsigned cls) { return cls - 1u < KP_NUM_CLASSES - 1u; }

/* ---- large blocks ----------------------------------------------------------------- */

/* Larger than any mapping can be: a request past it fails with ENOMEM
 * before a page count is computed (near SIZE_MAX that count wraps). */
#define LARGE_MAX ((size_t)1 << (KP_ADDRESS_BITS - 1))

/* A large block of size bytes aligned to align; *zeroed (if not NULL) says
 * its pages read as zero. NULL + ENOMEM. */
static void *large_alloc(size_t size, size_t align, int *zeroed) {
    _kp_init();
    if (size > LARGE_MAX) {
        errno = ENOMEM;
        return NULL;
    }
    size_t npages = (size + KP_PAGE_SIZE - 1) >> KP_PAGE_SHIFT;
    if (npages == 0) npages = 1;
    size_t align_pages = align > KP_PAGE_SIZE ? align >> KP_PAGE_SHIFT : 1;
    int fresh = 0;
    kp_span *s;
    if (KP_UNLIKELY(_kp_guard_every) && _kp_guard_sample()) {
        if (zeroed) *zeroed = 1;                /* its own fresh mapping */
        return guarded_alloc(size, align);
    }
    s = _kp_pageheap_large_alloc(npages, align_pages, size, &fresh);
    if (!s) {
        errno = ENOMEM;
        return NULL;
    }
    if (zeroed) *zeroed = fresh;
    return (void *)(s->start << KP_PAGE_SHIFT);
}

/* The live large block that starts at p, or NULL. REQUIRES page heap lock:
 * validation and what follows happen under one hold, so two threads freeing
 * the same block cannot both pass the check. */
static kp_span *large_span_locked(const void *p) {
    kp_span *s = _kp_span_of(p);
    if (!s || s->state != KP_SPAN_LARGE) return NULL;
    void *start = s->guarded ? s->freelist : (void *)(s->start << KP_PAGE_SHIFT);
    return p == start ? s : NULL;
}

/* Bytes from p, the start of large block s, to the end of its pages. */
static size_t large_usable(const kp_span *s, const void *p) {
    return ((s->start + s->npages) << KP_PAGE_SHIFT) - (uintptr_t)p;
}

/* What a pointer that is not a live block is, for the error message. */
static const char *not_live_reason(const void *p, unsigned cls) {
    if (cls == KP_CLASS_LARGE) return "pointer is inside a large block, not its start";
    if (cls == KP_CLASS_ARENA) return "pointer belongs to a kp_arena: arenas free their blocks at kp_arena_reset";
    if (cls != 0 && !small_class_ok(cls)) return "pointer belongs to a kp_pool: free it with kp_pool_free";
    /* A page kpool once mapped still has a pagemap entry. */
    if (_kp_pagemap_get((uintptr_t)p >> KP_PAGE_SHIFT))
        return "double free, or a pointer into memory kpool has taken back (not a live block)";
    return "pointer was not allocated by kpool";
}

/* NULL: a foreign free is misuse. The drop-in malloc (preload/malloc.c)
 * links a definition of its own that hands such pointers to glibc. */
__attribute__((weak)) void (*_kp_foreign_free_hook)(void *p);

/* Free a pointer whose page is not a small span: large, pool, arena, or not
 * kpool's at all. Validated under the page heap lock. */
static void free_other(void *p, unsigned cls, const char *call) {
    _kp_init();
    kp_lock *lk = _kp_pageheap_lock();
    _kp_lock(lk);
    kp_span *s = cls == KP_CLASS_LARGE ? large_span_locked(p) : NULL;
    int ok = s != NULL;
    if (ok && s->guarded) _kp_pageheap_guarded_free_locked(s);
    else if (ok) _kp_pageheap_large_free_locked(s);
    _kp_unlock(lk);
    if (ok) return;
    const char *what = not_live_reason(p, cls);
    void (*hook)(void *) = _kp_foreign_free_hook;
    if (hook && cls == 0 && !_kp_pagemap_get((uintptr_t)p >> KP_PAGE_SHIFT)) hook(p);
    else _kp_error(call, p, what);
}

/* ---- public API ---------------------------------------------------------------------- */

static inline __attribute__((always_inline)) void *malloc_any(size_t size) {
    if (KP_LIKELY(size <= KP_FINE_MAX)) return small_alloc(_kp_class_fine[(size + KP_FINE_STEP - 1) / KP_FINE_STEP], size);
    if (size <= KP_SMALL_MAX) return small_alloc(_kp_class_coarse[(size + KP_COARSE_STEP - 1) / KP_COARSE_STEP], size);
    return large_alloc(size, KP_MIN_ALIGN, NULL);
}

KP_HOT void *kp_malloc(size_t size) { return VG_ALLOCED(malloc_any(size)); }

void *kp_calloc(size_t count, size_t size) {
    size_t total;
    if (__builtin_mul_overflow(count, size, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    if (total > KP_SMALL_MAX) {
        /* Pages fresh from the OS, or given back with MADV_DONTNEED, are
         * zero already: writing them would only make them resident. */
        int zeroed = 0;
        void *p = large_alloc(total, KP_MIN_ALIGN, &zeroed);
        KP_VG(vg_alloc(p, zeroed));
        if (p && !zeroed) memset(p, 0, total);
        return p;
    }
    void *p = kp_malloc(total);     /* registered with valgrind there; memset defines it */
    if (p) memset(p, 0, total);
    return p;
}

/* A free whose page is not a small class in the flat map: outside it (no
 * map reserved, or an address above it), large, pool, arena, foreign, NULL. */
static __attribute__((noinline)) void free_not_flat(void *p, int sized, size_t size, const char *call) {
    int saved_errno = errno;
    unsigned cls = _kp_pagemap_class(p);
    if (small_class_ok(cls)) small_free(p, cls, sized, size, call);
    else if (p) free_other(p, cls, call);
    errno = saved_errno;
}

KP_HOT void kp_free(void *p) {
    KP_VG(vg_free(p));
    unsigned cls = _kp_pagemap_class_flat(p);
    if (KP_LIKELY(small_class_ok(cls))) {
        small_free(p, cls, 0, 0, "kp_free");
        return;
    }
    free_not_flat(p, 0, 0, "kp_free");
}

KP_HOT void kp_free_sized(void *p, size_t size) {
    /* The class byte is read anyway: it costs one load and makes a wrong
     * size (or a block from kp_aligned_alloc) harmless to the heap; only the
     * requested-bytes figure would be off, and a KP_DEBUG build reports it. */
    KP_VG(vg_free(p));
    unsigned cls = _kp_pagemap_class_flat(p);
    if (KP_LIKELY(small_class_ok(cls))) {
        small_free(p, cls, 1, size, "kp_free_sized");
        return;
    }
    free_not_flat(p, 1, size, "kp_free_sized");
}

/* 1 if p is the start of a slot of its small span (class cls) that has
 * been carved: handed out once at least, or on a free list. Lock-free:
 * every page of a small span maps to it, a live block's span does not
 * change, and `carved` is stored with release after the carved slots' free
 * marks (central.c), so a slot counted here shows its mark. */
static int small_carved_slot(const void *p, unsigned cls) {
    kp_span *s = _kp_pagemap_get((uintptr_t)p >> KP_PAGE_SHIFT);
    if (!s) return 0;
    uint64_t off = (uintptr_t)p - (s->start << KP_PAGE_SHIFT);
    uint64_t slot = (off * _kp_classes[cls].recip) >> 32;
    return slot * _kp_classes[cls].size == off && slot < __atomic_load_n(&s->carved, __ATOMIC_ACQUIRE);
}

size_t kp_usable_size(const void *p) {
    unsigned cls = _kp_pagemap_class(p);
    if (small_class_ok(cls))   /* the free mark tells a freed block (not with KP_HARDEN=0) */
        return small_carved_slot(p, cls) && !_kp_is_marked(p) ? _kp_classes[cls].size : 0;
    if (cls == KP_CLASS_LARGE) {
        _kp_lock(_kp_pageheap_lock());
        kp_span *s = large_span_locked(p);
        size_t n = s ? large_usable(s, p) : 0;
        _kp_unlock(_kp_pageheap_lock());
        return n;
    }
    if (cls != 0 && cls != KP_CLASS_ARENA) return _kp_pool_usable_size(p);
    return 0;
}

int kp_owns(const void *p) { return _kp_pagemap_class(p) != 0; }

/* The size requested for a block being reallocated: told by
 * kp_realloc_sized, or not (kp_realloc). */
#define UNTOLD SIZE_MAX

static void free_told(void *p, size_t told) {
    if (told == UNTOLD) kp_free(p);
    else kp_free_sized(p, told);
}

/* Move a block of `usable` bytes at p to a fresh one of size bytes. */
static void *realloc_move(void *p, size_t usable, size_t size, size_t told) {
    void *q = kp_malloc(size);
    if (!q) return NULL;
    memcpy(q, p, size < usable ? size : usable);
    free_told(p, told);
    return q;
}

/* kp_realloc(p, 0) of a valid p: p is freed and the unique pointer of
 * kp_malloc(0) comes back (NULL, p untouched, if that fails). */
static void *realloc_to_zero(void *p, size_t told) {
    void *fresh = kp_malloc(0);
    if (fresh) free_told(p, told);
    return fresh;
}

static void *small_realloc(void *p, unsigned cls, size_t size, size_t told) {
    /* A freed block carries the free mark: realloc of it is misuse, and
     * nothing is freed or allocated (it may sit on a free list). */
    if (KP_UNLIKELY(_kp_is_marked(p))) {
        _kp_error("kp_realloc", p, "pointer is a freed block (not live)");
        errno = EINVAL;
        return NULL;
    }
    /* A KP_DEBUG build also tells a pointer inside a block and a slot never
     * handed out here, before the block could be kept in place. */
    if (KP_DEBUG && DEBUG_MARK(p, DEBUG_CHECK, "kp_realloc") != 0) {
        errno = EINVAL;
        return NULL;
    }
    if (size == 0) return realloc_to_zero(p, told);
    size_t usable = _kp_classes[cls].size;
    /* Keep the block unless it would waste more than half of it. An old
     * request kp_realloc does not know counts as a free of untold size. */
    if (size <= usable && (size > usable / 2 || cls == 1)) {
        kp_tcache *tc = _kp_tcache_mine();
        if (tc) {
            KP_STAT_BUMP(tc->lists[cls].requested, size);
            if (told == UNTOLD) KP_STAT_BUMP(tc->moves[cls].unsized_frees, 1);
            else KP_STAT_DROP(tc->lists[cls].requested, told);
        }
        return p;
    }
    return realloc_move(p, usable, size, told);
}

/* A large block changes size without a copy: it keeps its pages while the
 * new size wastes at most half of them, else shrinks in place; it grows into
 * the free pages after it, or its pages move (mremap) to a range with room
 * to spare (half again), so growing step by step is not quadratic. A copy
 * happens only if the move fails, or the block becomes small. */
static void *large_realloc(void *p, size_t size, size_t told) {
    kp_lock *lk = _kp_pageheap_lock();
    _kp_lock(lk);
    kp_span *s = large_span_locked(p);
    if (!s) {
        _kp_unlock(lk);
        _kp_error("kp_realloc", p, not_live_reason(p, KP_CLASS_LARGE));
        errno = EINVAL;
        return NULL;
    }
    if (size > LARGE_MAX) {
        _kp_unlock(lk);
        errno = ENOMEM;
        return NULL;
    }
    size_t usable = large_usable(s, p);
    /* The small paths and the copy below are kp_malloc and kp_free, which
     * tell valgrind themselves; a block kept with its pages changes nothing. */
    if (s->guarded) {                         /* a guarded block keeps its guard: a new block */
        _kp_unlock(lk);
        return size == 0 ? realloc_to_zero(p, told) : realloc_move(p, usable, size, told);
    }
    size_t npages = (size + KP_PAGE_SIZE - 1) >> KP_PAGE_SHIFT;
    int kept = size != 0 && npages <= s->npages && npages > s->npages / 2;
    if (!kept && size <= KP_SMALL_MAX) {      /* a small block now, or none */
        _kp_unlock(lk);
        return size == 0 ? realloc_to_zero(p, told) : realloc_move(p, usable, size, told);
    }
    if (!kept) kept = _kp_pageheap_large_resize_locked(s, npages) == 0;
    if (!kept && npages > s->npages) kept = _kp_pageheap_large_move_locked(s, npages + npages / 2) == 0;
    if (kept) {
        _kp_pageheap_large_requested_locked(s, size);
        void *at = (void *)(s->start << KP_PAGE_SHIFT);
        KP_VG(vg_large_resized(p, usable, at, large_usable(s, at)));
        _kp_unlock(lk);
        return at;
    }
    _kp_unlock(lk);
    return realloc_move(p, usable, size, told);
}

static void *realloc_told(void *p, size_t size, size_t told) {
    if (!p) return kp_malloc(size);
    unsigned cls = _kp_pagemap_class(p);
    if (small_class_ok(cls)) return small_realloc(p, cls, size, told);
    if (cls == KP_CLASS_LARGE) return large_realloc(p, size, told);
    /* Pools, arenas, freed or foreign memory: nothing happens. */
    _kp_error("kp_realloc", p, cls == 0 ? "pointer is not a live kp_malloc block" : not_live_reason(p, cls));
    errno = EINVAL;
    return NULL;
}

void *kp_realloc(void *p, size_t size) { return realloc_told(p, size, UNTOLD); }
void *kp_realloc_sized(void *p, size_t old_size, size_t size) { return realloc_told(p, size, old_size); }

void *kp_aligned_alloc(size_t alignment, size_t size) {
    if (!_kp_is_pow2(alignment)) {
        errno = EINVAL;
        return NULL;
    }
    _kp_init();   /* the class search below reads the class table */
    if (alignment <= KP_MIN_ALIGN) return kp_malloc(size);
    if (size <= KP_SMALL_MAX && alignment <= KP_PAGE_SIZE) {
        /* A class whose size is a multiple of the alignment: its objects
         * sit at multiples of their size from a page-aligned span start. */
        size_t want = _kp_align_up(size ? size : 1, alignment);
        if (want <= KP_SMALL_MAX) {
            unsigned cls = _kp_size_class(want);
            while (cls < KP_NUM_CLASSES && _kp_classes[cls].size % alignment) cls++;
            if (cls < KP_NUM_CLASSES) return VG_ALLOCED(small_alloc(cls, size));
        }
    }
    if (alignment > ((size_t)1 << (KP_ADDRESS_BITS - 2))) {
        errno = ENOMEM;
        return NULL;
    }
    return VG_ALLOCED(large_alloc(size ? size : 1, alignment, NULL));
}

void kp_thread_flush(void) {
    kp_tcache *tc = _kp_tcache_mine();
    if (tc) _kp_tcache_flush_thread(tc);
}

size_t kp_trim(void) {
    _kp_init();
    kp_thread_flush();
    for (unsigned c = 1; c < KP_NUM_CLASSES; c++) _kp_central_drain(c);
    size_t meshed = _kp_mesh_all();   /* before the page heap's trim: joins free no spans, undos do */
    return meshed + _kp_pageheap_trim();
}
