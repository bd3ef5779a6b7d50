/* kp_types.h: every internal struct and tuning constant of kpool, with the
 * rules they obey. Included by every layer; never installed.
 *
 *   kp_malloc/kp_free ─► tcache (per thread, no locks)
 *                          │ batches
 *                          ▼
 *                        central (one lock per size class)
 *                          │ spans
 *                          ▼
 *   pool, arena ───────► pageheap (one lock) ─► pagemap (lock-free reads)
 *                          │
 *                          ▼
 *                        os (mmap, madvise)
 */
#ifndef KP_TYPES_H
#define KP_TYPES_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stddef.h>

#include "kpool.h"

/* ---- build-time knobs -------------------------------------------------- */
#ifndef KP_DEBUG
#define KP_DEBUG 0          /* 1: cheap asserts and exact double-free checks; 2: expensive checks */
#endif
#ifndef KP_STATS
#define KP_STATS 1          /* 0 compiles the per-thread event counters out */
#endif
/* Hardening, on by default (kp_internal.h: free-block words). KP_HARDEN=0
 * turns both measures off, for comparison; each can be set on its own. */
#ifndef KP_HARDEN
#define KP_HARDEN 1
#endif
/* Meshing (mesh.c): compiled in by default, on at run time with KPOOL_MESH=1. */
#ifndef KP_MESH
#define KP_MESH 1
#endif
#ifndef KP_HARDEN_LINKS
#define KP_HARDEN_LINKS KP_HARDEN   /* free-list links stored encoded, checked when followed */
#endif
#ifndef KP_HARDEN_MARKS
#define KP_HARDEN_MARKS KP_HARDEN   /* a free small block is marked: every double free is caught */
#endif

#define KP_LIKELY(x) __builtin_expect(!!(x), 1)
#define KP_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define KP_INTERNAL __attribute__((visibility("hidden")))
#define KP_CACHELINE 64
/* The fast paths start a cache line: where they fell in a line moved the
 * pairs workload by 3-8% between builds whose code was otherwise the same
 * (benchmarks/REPORT.md run 10), which hid the effect of real changes. */
#define KP_HOT __attribute__((aligned(KP_CACHELINE)))

/* ---- pages and classes -------------------------------------------------- */
#define KP_PAGE_SHIFT 13                       /* kpool pages are 8 KiB */
#define KP_PAGE_SIZE ((size_t)1 << KP_PAGE_SHIFT)
#define KP_SMALL_MAX ((size_t)256 << 10)       /* larger requests get spans of their own */
#define KP_FINE_MAX 1024                       /* 16-byte steps up to here */
#define KP_FINE_STEP 16
#define KP_COARSE_STEP 32                      /* lookup granularity above KP_FINE_MAX (1 KiB + 1/32) */
#define KP_NUM_CLASSES 137                     /* class 0 is "not a small class" */
#define KP_MIN_ALIGN 16
#define KP_CLASS_POOL 255                      /* pagemap class byte of a pool chunk (no fast free) */
#define KP_CLASS_POOL_SLOT0 KP_NUM_CLASSES      /* + slot: a cached pool's chunks (fast free) */
#define KP_CLASS_NEVER 254                     /* written to no page: "this pool has no fast free" */
#define KP_CLASS_LARGE 253                     /* every page of a large block */
#define KP_CLASS_ARENA 252                     /* every page of an arena chunk */
#define KP_POOL_CHUNK_MIN ((size_t)64 << 10)   /* pool chunks: at least this, 16 blocks, a power of two */
#define KP_POOL_CHUNK_ALIGNED ((size_t)4 << 20) /* chunks up to here are aligned to their size */

_Static_assert(KP_NUM_CLASSES <= KP_STATS_MAX_CLASSES, "the stats struct holds every class");
_Static_assert(KP_NUM_CLASSES <= 256, "a class index fits in the pagemap's byte");
_Static_assert(KP_FINE_MAX % KP_FINE_STEP == 0, "fine classes end on a step");
_Static_assert(KP_SMALL_MAX % KP_COARSE_STEP == 0, "coarse lookup covers the small limit");

/* ---- address space and pagemap ----------------------------------------- */
#define KP_ADDRESS_BITS 48
#define KP_PAGEMAP_BITS (KP_ADDRESS_BITS - KP_PAGE_SHIFT)   /* 35 bits of page number */
#define KP_LEAF_BITS 18
#define KP_ROOT_BITS (KP_PAGEMAP_BITS - KP_LEAF_BITS)
#define KP_LEAF_PAGES ((size_t)1 << KP_LEAF_BITS)
#define KP_CLASSMAP_PAGES ((size_t)1 << 25)     /* flat class map window: 256 GiB of address space, 32 MiB reserved */
#define KP_CLASSMAP_PAGES_MAX ((size_t)1 << 30)  /* KPOOL_CLASSMAP_PAGES is capped here (1 GiB reserved) */

/* ---- page heap ----------------------------------------------------------- */
#define KP_EXACT_LISTS 128                     /* free lists for spans of 1..128 pages */
#define KP_GROW_MIN ((size_t)2 << 20)          /* map at least this much at a time */
#define KP_GROW_MAX ((size_t)64 << 20)
/* Free, unreleased page-heap bytes kept before release: in-use bytes / DIV,
 * within [MIN, MAX]. A fixed 16 MiB cost the json round trip 148k page
 * faults (tcmalloc 91k) and a small program (ast of 400 files) 1.8 MB of
 * peak RSS; this rule: 115k faults, -1.8 MB (benchmarks/REPORT.md run 7).
 * MIN 8 MiB rather than 4: that ast run faulted 17.9k pages in (mimalloc
 * 6.5k) by giving back and faulting in again the pages of each file's tree;
 * 8 MiB: 9.8k faults, 4% less time, +0.8 MB peak RSS (REPORT.md run 9). */
#ifndef KP_RETAIN_DIV
#define KP_RETAIN_DIV 4
#endif
#ifndef KP_RETAIN_MIN
#define KP_RETAIN_MIN ((size_t)8 << 20)
#endif
#define KP_RETAIN_MAX ((size_t)256 << 20)
#ifndef KP_DECAY_MS
#define KP_DECAY_MS 1000                       /* free spans older than this go back to the OS */
#endif
#define KP_DECAY_CHECK_MS 50                   /* how often the page heap looks at the clock */
#define KP_RECENT_SPANS 8                      /* freed large spans kept whole for reuse */
#define KP_RECENT_MAX_PAGES 1024               /* ... of at most 8 MiB each */
#define KP_RECENT_BYTES ((size_t)16 << 20)     /* ... and this much in all */
_Static_assert(KP_RECENT_MAX_PAGES * KP_PAGE_SIZE <= KP_RECENT_BYTES, "a kept span fits the budget");

/* ---- meshing ------------------------------------------------------------- */
#define KP_MESH_MAX_MEMBERS 32                 /* spans sharing one physical page at most */
#define KP_MESH_CANDIDATES 2048                /* spans of a class looked at per round */
#define KP_MESH_PROBES 512                     /* destinations tried per source */
#define KP_MESH_PERIOD_MS 100                  /* the decay path meshes at most this often */
#define KP_MESH_TICK_JOINS 512                 /* ... and at most this many spans each time */
#define KP_MESH_MIN_FREE ((size_t)1 << 20)     /* a class with less free in its spans is skipped */

/* ---- thread cache -------------------------------------------------------- */
/* The byte budget of one thread's lists. A process with one thread cache
 * gets KP_TCACHE_SOLO_BYTES; with more, each gets an even share of
 * KP_TCACHE_TOTAL_BYTES among the live caches, within [MIN, MAX] (32 MiB
 * overall and 4 MiB a thread, as tcmalloc). A lone thread only takes back
 * what it freed itself, and its cache is free memory it keeps resident:
 * 4 MiB for it cost 1.3 MB of peak RSS on an ast.parse run of 400 stdlib
 * files (31.1 -> 32.4 MB) with no speed gained (wall 1.00 [0.71-1.28]).
 * Blocks that one thread frees for another come in bursts its lists must
 * absorb: on larson at 2 threads, 4 MiB a thread cut the thread-cache
 * misses per 20M operations from 0.3-0.5M to 0.05-0.3M and its wall time
 * to 0.78x (median of 20 interleaved runs; benchmarks/REPORT.md run 11). */
#ifndef KP_TCACHE_SOLO_BYTES
#define KP_TCACHE_SOLO_BYTES ((size_t)2 << 20)
#endif
#ifndef KP_TCACHE_MAX_BYTES
#define KP_TCACHE_MAX_BYTES ((size_t)4 << 20)
#endif
#ifndef KP_TCACHE_MIN_BYTES
#define KP_TCACHE_MIN_BYTES ((size_t)512 << 10)
#endif
#ifndef KP_TCACHE_TOTAL_BYTES
#define KP_TCACHE_TOTAL_BYTES ((size_t)32 << 20)
#endif
_Static_assert(KP_TCACHE_SOLO_BYTES <= KP_TCACHE_MAX_BYTES, "a lone thread's budget is within the range");
_Static_assert(KP_TCACHE_MIN_BYTES <= KP_TCACHE_MAX_BYTES, "a thread's budget range is not empty");
/* A list's max grows on its overflows (frees) up to KP_TCACHE_FREE_BATCHES
 * batches; past that only a refill grows it, by what the list gave back
 * since its last refill, up to KP_TCACHE_MAX_BATCHES (tcache.c). A thread
 * that only frees a class (a consumer) or only allocates it (a producer)
 * keeps a few batches: lists grown on every overflow, or on every refill,
 * made prodcons at 2 threads 1.08-1.29x slower. A thread that frees many
 * blocks and then allocates them again (CPython dropping one tree and
 * building the next) keeps them in its list, out of the central lists and
 * the spans: an ast.parse run of 150 files made 31k central fetches, not
 * 45k, and executed 0.8% fewer instructions (benchmarks/REPORT.md run 10). */
#ifndef KP_TCACHE_FREE_BATCHES
#define KP_TCACHE_FREE_BATCHES 4
#endif
#ifndef KP_TCACHE_MAX_BATCHES
#define KP_TCACHE_MAX_BATCHES 64
#endif
_Static_assert(KP_TCACHE_FREE_BATCHES <= KP_TCACHE_MAX_BATCHES, "frees grow a list no further than refills");
#define KP_BATCH_MAX 32
#define KP_STEAL_TRIES 4                       /* lists a full budget looks at per grow */
#define KP_POOL_SLOTS 64                       /* pools with a per-thread cache at once */
_Static_assert(KP_CLASS_POOL_SLOT0 + KP_POOL_SLOTS <= KP_CLASS_ARENA, "pool slot tags fit below the reserved bytes");

/* ---- locks ----------------------------------------------------------------
 * A mutex that counts acquisitions, contention (the try-lock failed) and the
 * time spent waiting (timed only when contended). The counters are written
 * only while the lock is held and read with relaxed loads.                */
typedef struct kp_lock {
    pthread_mutex_t mutex;
    _Atomic uint64_t acquires;
    _Atomic uint64_t contended;
    _Atomic uint64_t wait_ns;
} kp_lock;

/* ---- spans --------------------------------------------------------------- */
typedef enum kp_span_state {
    KP_SPAN_DEAD = 0,     /* struct on the metadata free list */
    KP_SPAN_FREE,         /* in the page heap's free lists */
    KP_SPAN_SMALL,        /* carved into objects of one size class */
    KP_SPAN_LARGE,        /* one large block */
    KP_SPAN_POOL,         /* a chunk of a kp_pool */
    KP_SPAN_ARENA,        /* a chunk of a kp_arena */
    KP_SPAN_CACHED        /* a freed large block kept whole for reuse (pageheap.c: recent) */
} kp_span_state;

/* A run of pages. Invariants:
 *   FREE:  pagemap maps its first and last page to it; it is in exactly one
 *          page-heap size list and, if !released, in the age list.
 *   in use: pagemap maps every page to it.
 *   SMALL: allocated + |freelist| + (capacity - carved) == capacity, and
 *          allocated counts objects in thread caches and in users' hands;
 *          it is in its central list's `partial` list iff it has a free
 *          object (freelist or uncarved). */
typedef struct kp_span {
    uintptr_t start;              /* first page number */
    size_t npages;
    struct kp_span *next, *prev;  /* size list (FREE) or central partial list (SMALL) */
    struct kp_span *age_next, *age_prev; /* FREE && !released: oldest first */
    void *freelist;               /* SMALL: objects given back */
    void *freelist_tail;          /* SMALL: its last object (NULL when empty), for O(1) splices */
    void *owner;                  /* POOL: the kp_pool; ARENA: the kp_arena */
    size_t requested;             /* LARGE: bytes requested */
    uint64_t free_since_ms;       /* FREE: when it became free */
    struct kp_span *mesh_primary; /* SMALL, meshed (mesh.c): its group's primary; NULL if not an alias.
                                     Beside `allocated`: a free's span lookup reads one cache line */
    uint32_t allocated;           /* SMALL: objects out of the span */
    uint32_t carved;              /* SMALL: objects carved so far (bump) */
    uint32_t capacity;            /* SMALL: objects the span holds */
    uint8_t sizeclass;            /* SMALL: its class */
    uint8_t state;                /* kp_span_state */
    uint8_t released;             /* FREE: pages given back to the OS */
    uint8_t on_list;              /* SMALL: in the central partial list */
    uint8_t guarded;              /* LARGE: a KPOOL_GUARD block, its own mapping; freelist
                                     holds the block, the page after the span is inaccessible */
    /* Meshing (mesh.c). A group is a primary SMALL span and the aliases
     * meshed into it: every member's pages show one physical page, and the
     * primary's freelist, allocated and carved are the group's. */
    struct kp_span *mesh_next;     /* primary and aliases: the group's next alias */
    struct kp_span *group_next, *group_prev; /* primary of a group: its class's group list */
    uint8_t mesh_members;          /* primary: spans in the group, itself included (0: no group) */
    uint8_t mesh_mapped;           /* primary: members that map its memfd page (0 after fork's split) */
    uint8_t mesh_on_file;          /* member (primary too): its range maps the group's file page */
    uint8_t mesh_split;            /* primary: members hold private copies (after fork); not meshed again */
    _Atomic uint8_t mesh_busy;     /* write-protected by a mesh operation now: a fault waits */
#if KP_DEBUG
    _Atomic uint64_t live_bits[8]; /* SMALL: one bit per object handed to a user */
#endif
} kp_span;

/* ---- size classes -------------------------------------------------------- */
typedef struct kp_class_info {
    uint32_t size;        /* block size */
    uint32_t npages;      /* pages per span */
    uint32_t objects;     /* objects per span */
    uint32_t batch;       /* objects moved per tcache refill or flush */
    uint32_t tcache_max;  /* longest thread list before a flush */
    uint32_t tcache_free_max; /* ... as far as frees alone grow it (tcache.c) */
    uint32_t transfer_slots; /* whole batches the central list keeps (central.c) */
    uint64_t recip;       /* ceil(2^32 / size): offset -> index without division */
} kp_class_info;

/* ---- central free lists -------------------------------------------------- */
#ifndef KP_TRANSFER_SLOTS
#define KP_TRANSFER_SLOTS 16                   /* whole batches a central list keeps */
#endif
#ifndef KP_TRANSFER_BYTES
#define KP_TRANSFER_BYTES ((size_t)64 << 10)   /* at most this much per class */
#endif

typedef struct kp_central {
    kp_lock lock;
    kp_span partial;                /* sentinel: spans with a free object */
    _Atomic size_t free_objects;    /* free objects: span freelists, uncarved, transfer slots (written under lock) */
    _Atomic size_t spans;           /* spans held (written under lock) */
    uint32_t used;                  /* transfer slots holding a batch (<= the class's transfer_slots) */
    void *slots[KP_TRANSFER_SLOTS]; /* NULL-terminated chains of exactly one batch */
} __attribute__((aligned(KP_CACHELINE))) kp_central;

/* ---- thread cache ---------------------------------------------------------
 * Owned by one thread. head/count are its LIFO list; count and the counters
 * are atomics only so that stats readers in other threads do not race: the
 * owner updates them with relaxed load + store (plain moves on x86).
 * The byte cap costs nothing per operation: every list has a maximum length,
 * and the sum over lists of max * size (budget_used) stays within the
 * thread's budget (tcache.c: _kp_tcache_budget_cap); a list that wants to
 * grow past it takes budget from larger lists (tcache.c: grow). Frees are
 * not counted per operation: per class,
 *   frees == allocs + count - fetched + returned.                          */
typedef struct kp_tlist {          /* one cache line holds two lists */
    void *head;
    _Atomic uint32_t count;         /* count <= max */
    uint32_t max;
    _Atomic uint64_t allocs;
    _Atomic uint64_t requested;     /* + request at alloc, - request at sized free (wraps) */
} kp_tlist;

typedef struct kp_tmoves {          /* objects moved by the slow paths */
    _Atomic uint64_t fetched;       /* central -> this list */
    _Atomic uint64_t returned;      /* this list -> central */
    _Atomic uint64_t unsized_frees; /* frees that did not tell the request size */
    uint32_t spilled;               /* given back by overflows since the last refill (owner only) */
} kp_tmoves;

typedef struct kp_pool_cache {      /* a thread's cache of one unbounded pool */
    _Atomic uint64_t pool_id;       /* 0: unused; else the pool it caches */
    void *head;                     /* blocks freed to this thread */
    _Atomic uint32_t count;
    _Atomic uint64_t allocs;
    _Atomic uint64_t misses;        /* allocs served by a never-used block */
    _Atomic uint64_t moved;         /* + blocks taken from the shared stack, - blocks pushed to it (wraps) */
    char *fresh, *fresh_end;        /* blocks carved for this thread, not yet used */
    /* frees are not counted per operation: frees == allocs - misses + count - moved */
} kp_pool_cache;

typedef struct kp_thread_counters {  /* per thread; summed on read */
    _Atomic uint64_t tcache_misses;
    _Atomic uint64_t central_fetches;   /* batches */
    _Atomic uint64_t central_returns;   /* batches */
} kp_thread_counters;

typedef struct kp_tcache {
    kp_tlist lists[KP_NUM_CLASSES];
    kp_thread_counters counters;
    size_t budget_used;             /* sum of max * size over lists */
    unsigned steal_next;            /* next list grow() may take budget from */
    kp_tmoves moves[KP_NUM_CLASSES];
    struct kp_tcache *reg_next, *reg_prev; /* registry, under the registry lock */
    pthread_t thread;
    kp_pool_cache pools[KP_POOL_SLOTS];
} kp_tcache;

/* Sums over every thread, live and exited (tcache.c). */
typedef struct kp_tcache_totals {
    uint64_t allocs[KP_NUM_CLASSES], frees[KP_NUM_CLASSES], unsized[KP_NUM_CLASSES];
    size_t cached[KP_NUM_CLASSES];  /* free objects in caches now */
    uint64_t tcache_misses, central_fetches, central_returns, requested;
    uint64_t uncached_ops;          /* allocs and frees by threads without a cache */
    size_t threads;
} kp_tcache_totals;

#endif /* KP_TYPES_H */
