/* kpool.h: the public C API of kpool, a memory-pool allocator.
 *
 * One process has one kpool heap, shared by every caller of this library
 * (C code, cffi, and the Python package kpool, which links the same
 * libkpool.so). libkpool-malloc.so (csrc/preload/malloc.c) is kpool as the
 * process's malloc: its own copy of this code behind malloc, free, realloc,
 * new and delete, exporting none of the kp_* names; a program using both
 * has two heaps, and a pointer from one is foreign to the other.
 *
 * Errors: functions that allocate return NULL and set errno:
 *   ENOMEM  out of memory, or a size so large it cannot be represented;
 *   EINVAL  a bad argument (alignment not a power of two, block size 0, ...);
 *   ENOBUFS a bounded pool is at its capacity.
 * Misuse that kpool detects goes to the error handler (kp_set_error_handler),
 * which by default prints a message naming the call and the address and
 * aborts; a handler that returns makes the call do nothing. A release build
 * detects:
 *   - a free or realloc of a pointer kpool never mapped (stack, static data,
 *     another allocator's memory);
 *   - a large block (over 256 KiB) freed twice, or through a pointer inside
 *     it;
 *   - a pool, arena or large block given to a call that is not its own
 *     (kp_free of a pool block, kp_realloc of an arena block, ...);
 *   - a small block freed twice, however long after the first free and
 *     from whichever thread (exact for frees ordered between threads; a
 *     free block holds a random mark in its second word, so only a live
 *     block whose second word the program set to that very value would be
 *     taken for a free one);
 *   - a write into a freed block's first word (a use after free, or an
 *     overflow from the block before it): free-list links are stored
 *     encoded with a random key, and the allocation that would follow the
 *     damaged link reports it instead of handing out the address written
 *     (the rest of that list is dropped: never handed out, not reused).
 *     Every written word whose top 16 bits are 0 or all ones (zero, a
 *     pointer, a small integer of either sign) is caught, and all but about
 *     one in a million other words; a write of the word's lowest byte alone
 *     is missed one time in 16;
 *   - every kp_pool_free of anything but a live block of that pool.
 * The two hardening measures above cost one load and two stores per
 * alloc/free pair; a build with -DKP_HARDEN=0 leaves them out (then only a
 * small block freed twice in a row by one thread is caught). With them, a
 * small block kp_malloc hands out has its first 16 bytes cleared (its own
 * free-list link and mark; the rest of it may still hold what earlier
 * blocks at that address held); kp_calloc is the call that promises zeroed
 * memory.
 * Only a KP_DEBUG build also detects, for small blocks (256 KiB or less): a
 * pointer inside a block, a slot of a span that was never handed out, and
 * kp_free_sized with a size larger than the block. A release build accepts
 * those silently, and later allocations may overlap.
 *
 * Guard sampling: KPOOL_GUARD=N in the environment places every Nth
 * allocation (small or large; N=1: all of them) on its own pages, ending
 * where the block ends, with an inaccessible page after it. A write or
 * read past the block's usable size then faults at once, and kpool's
 * SIGSEGV handler prints the block's address and size before the signal
 * takes its course (a handler installed before kpool's is chained). Freed
 * guarded blocks are unmapped, so a later use faults too (until the
 * address is mapped again). Thread caches are off while sampling (each
 * call takes the shared lists): a debugging mode, not a release setting.
 *
 * Valgrind: a build with -DKP_VALGRIND=1 (make -C csrc valgrind) tells
 * memcheck about every block kpool hands out and takes back (heap, pool
 * and arena blocks), so memcheck reports a use after free, a read of bytes
 * never written, an access past a block's usable size and leaked blocks as
 * it does for malloc's; outside valgrind such a build costs one load and a
 * branch per call, and the default build (KP_VALGRIND=0) has none of it.
 *
 * Meshing: KPOOL_MESH=1 in the environment (read once, at start-up) turns
 * it on. kp_trim, and the slow paths at most every 100 ms (a bounded pass),
 * then find spans of one size class whose live blocks sit at different
 * offsets, copy one span's live blocks into the other's physical page at
 * the same offsets, and map the first span's addresses onto that page: its
 * own page goes back to the OS, and no pointer changes (Mesh, PLDI 2019).
 * Every block keeps its address and its bytes, a block is never handed out
 * twice, and a write made while its span is being meshed waits (in kpool's
 * SIGSEGV handler, installed on the first pass and chained to the one that
 * was there) and lands on the new page. What it costs: a system call that
 * writes into a block (read(2) into a buffer) during those few microseconds
 * fails with EFAULT instead of waiting, and a thread that blocks SIGSEGV
 * and writes there is killed, which is why it is off by default;
 * fork() first gives every meshed span a private copy of its page (the
 * memory saved is given up; the child and the parent share nothing); and
 * each meshed span takes a kernel mapping (meshing stops at a quarter of
 * vm.max_map_count). kp_stats: bytes_meshed, meshes. In a -DKP_MESH=0
 * build, or where OS pages are larger than 8 KiB, KPOOL_MESH=1 does nothing.
 *
 * Start-up: every function works from the first call, also before kpool's
 * own constructor has run (from another library's constructor, a C++
 * static initialiser, a preloaded malloc's first caller); the first call
 * initialises kpool, once, thread-safely.
 *
 * Address space: kpool reserves 32 MiB of address space for its class map
 * (resident only where written) and maps the rest as it is used, so a
 * process that lowers RLIMIT_AS after start-up keeps allocating up to its
 * limit. KPOOL_CLASSMAP_PAGES=N sets the map's size in pages (0: none; every
 * lookup then walks a radix tree, a little slower).
 *
 * Thread keys: kpool needs one pthread key. In a process that has used all
 * PTHREAD_KEYS_MAX keys, threads run without caches (every call goes to the
 * shared lists), and kp_stats says so (tcaches_unavailable).
 *
 * Alignment: every block is aligned to at least 16 bytes; a block whose size
 * class is a power of two up to the page size (8 KiB) is aligned to that size.
 *
 * Thread safety: every function may be called from any thread, except that
 * one kp_arena must not be used by two threads at once (see below).
 *
 * Memory held per thread: each thread caches free blocks without locks. With
 * N live threads, a thread's cache may hold up to 32 MiB / N, but never less
 * than 512 KiB nor more than 2 MiB (so over 64 threads, N * 512 KiB in all).
 * A cache over its share, because threads were started, gives the excess
 * back over its next few overflows.
 * kp_thread_flush() empties the calling thread's cache; a thread's cache is
 * given back when the thread exits.
 */
#ifndef KPOOL_H
#define KPOOL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define KP_API __attribute__((visibility("default")))
#else
#define KP_API
#endif

#define KPOOL_VERSION_MAJOR 0
#define KPOOL_VERSION_MINOR 1
#define KPOOL_VERSION_PATCH 0
#define KPOOL_VERSION_STRING "0.1.0"

/* ------------------------------------------------------------------------
 * General heap
 * ---------------------------------------------------------------------- */

/* kp_malloc(0) returns a unique pointer that may be passed to kp_free. */
KP_API void *kp_malloc(size_t size);
/* count * size overflowing returns NULL with errno ENOMEM. Memory is zeroed. */
KP_API void *kp_calloc(size_t count, size_t size);
/* kp_realloc(NULL, n) is kp_malloc(n). kp_realloc(p, 0) frees p and returns
 * a fresh unique pointer, as kp_malloc(0) would (never NULL on success); on
 * failure it returns NULL and p is left untouched. A p that is not a live
 * block of kp_malloc and friends (a pool or arena block, freed or foreign
 * memory) reaches the error handler; if that returns, kp_realloc returns
 * NULL with errno EINVAL and nothing is freed or allocated, also for size 0
 * (a freed small block is told by the hardening's free mark: a KP_HARDEN=0
 * build cannot tell it from a live one). */
KP_API void *kp_realloc(void *p, size_t size);
/* kp_realloc for a caller that knows the size requested for p (old_size,
 * as kp_free_sized's size): kp_stats' bytes_requested then stays exact,
 * where kp_realloc of a small block makes it an estimate (requested_exact
 * 0). Everything else, misuse included, is kp_realloc's (and its handler
 * calls name kp_realloc). */
KP_API void *kp_realloc_sized(void *p, size_t old_size, size_t size);
/* alignment must be a power of two (else NULL, errno EINVAL); any power of
 * two up to 1 GiB works. size need not be a multiple of alignment. */
KP_API void *kp_aligned_alloc(size_t alignment, size_t size);
/* NULL is a no-op. kp_free and kp_free_sized keep errno as it was. */
KP_API void kp_free(void *p);
/* C23 free_sized: size is the size that was requested for p, and
 * kp_stats' bytes_requested goes down by it. A size up to kp_usable_size(p)
 * still frees the block correctly, but then bytes_requested goes down by
 * more than p added to it. */
KP_API void kp_free_sized(void *p, size_t size);
/* For the start of a live block of kp_malloc and friends or of a pool: the
 * bytes usable there (>= the size requested; a pool's block size). For
 * anything else (NULL, a pointer inside a block, an arena block, memory
 * kpool does not own, a freed pool block, a freed small block, a slot of a
 * span that was never handed out, the end of a span past its last slot) 0. A
 * KP_HARDEN=0 build cannot tell a freed small block (of kp_malloc) from a
 * live one and answers its size. Reads word 1 of the block: do not call it
 * while another thread writes that word. */
KP_API size_t kp_usable_size(const void *p);
/* 1 if p lies in pages kpool has carved for blocks and not yet taken back
 * to its page heap: a span of small blocks, a large block, a pool's or an
 * arena's chunk (interior pointers too), else 0. One lock-free load, so it
 * does not tell a live block from free room beside it: a freed small block,
 * a slot never handed out, the end of a span or of an arena chunk answer 1
 * until the span's pages go back; a pointer kpool never mapped (stack,
 * glibc's malloc, static data) always answers 0. kp_usable_size tells a
 * live block's start. */
KP_API int kp_owns(const void *p);
/* Give this thread's cached free blocks back to the shared lists. */
KP_API void kp_thread_flush(void);
/* Give all idle memory back to the OS: this thread's cache, the shared
 * lists' empty spans, the page heap's free spans, and (KPOOL_MESH=1) the
 * pages of spans it meshes. Returns bytes released. */
KP_API size_t kp_trim(void);

/* ------------------------------------------------------------------------
 * Fixed-size pools
 *
 * block_size: 1 .. KP_POOL_MAX_BLOCK; align: 0 (means 16) or a power of two
 * up to KP_POOL_MAX_ALIGN; capacity: the most blocks live at once, exact
 * across threads, 0 for unbounded. Unbounded pools keep a per-thread cache
 * (no lock, no atomic on the fast path) and move batches between threads
 * through a lock-free shared stack; bounded pools keep one free list under
 * the pool's lock so that the capacity is exact.
 * kp_pool_destroy gives back all of the pool's memory, including blocks still
 * live (they become invalid) and blocks cached by threads that exited. In a
 * KP_DEBUG build destroying a pool with live blocks reaches the error handler.
 * ---------------------------------------------------------------------- */
#define KP_POOL_MAX_BLOCK ((size_t)1 << 30)
#define KP_POOL_MAX_ALIGN ((size_t)1 << 20)

typedef struct kp_pool kp_pool;
KP_API kp_pool *kp_pool_create(size_t block_size, size_t align, size_t capacity);
/* NULL when exhausted (errno ENOBUFS) or out of memory (errno ENOMEM). */
KP_API void *kp_pool_alloc(kp_pool *pool);
/* p must be a live block of pool; anything else (another pool's block, a
 * pointer inside a block, a block already freed, even long ago, a slot never
 * handed out, foreign memory) reaches the error handler and leaves the pool
 * intact: its capacity stays exact and no block is handed out twice. This is
 * exact for frees in one thread or ordered between threads, and in bounded
 * pools always; two threads freeing one block of an unbounded pool at the
 * same instant may both be accepted. A free block's second word holds a
 * random per-pool marker: a live block whose second word the program set to
 * that very value would be taken for a free one. NULL is a no-op. */
KP_API void kp_pool_free(kp_pool *pool, void *p);
KP_API void kp_pool_destroy(kp_pool *pool);
/* The block size rounded up to the pool's alignment. */
KP_API size_t kp_pool_block_size(const kp_pool *pool);
/* 1 if p is a live block of pool (handed out and not freed), else 0. O(1);
 * in bounded pools under the pool's lock. */
KP_API int kp_pool_owns(kp_pool *pool, const void *p);
/* Give the memory of wholly idle chunks back; bytes released. */
KP_API size_t kp_pool_trim(kp_pool *pool);

typedef struct kp_pool_stats {
    size_t struct_size;       /* set by the caller to sizeof(kp_pool_stats) */
    uint64_t allocs;          /* successful kp_pool_alloc calls */
    uint64_t frees;           /* kp_pool_free calls */
    uint64_t hits;            /* allocs served by a block used before */
    uint64_t misses;          /* allocs served by a new block (unbounded pools carve
                                 new blocks a batch at a time for each thread) */
    uint64_t exhausted;       /* allocs refused at capacity (ENOBUFS) */
    uint64_t capacity_waits;  /* waits for a free block, noted by kp_pool_note_wait */
    size_t live;              /* blocks live now: exact for bounded pools; for
                                 unbounded ones summed from counters that other
                                 threads move meanwhile, kept within [0, blocks
                                 carved] */
    size_t high_water;        /* most blocks live at once: exact for bounded pools;
                                 for unbounded ones the most seen when a block was
                                 carved or stats were read (never above the
                                 blocks carved) */
    size_t capacity;          /* 0 = unbounded */
    size_t block_size;
    size_t bytes_mapped;      /* bytes of chunks held by the pool */
    size_t chunks;
    /* added in 0.1.0's second pool-stats layout */
    size_t free_blocks;       /* blocks carved in the chunks held and not live:
                                 ready for reuse without new memory (a thread's
                                 cache, the shared lists); within [0, carved] */
} kp_pool_stats;
/* 0 on success, -1 with errno EINVAL if pool or out is NULL or struct_size
 * is smaller than the struct up to `chunks` (the first layout). Fills as
 * much of the struct as struct_size covers, and nothing past it. */
KP_API int kp_pool_stats_get(kp_pool *pool, kp_pool_stats *out);
/* Callers that wait for a block at capacity (the Python BufferPool) count
 * their waits here so that they appear in kp_pool_stats. */
KP_API void kp_pool_note_wait(kp_pool *pool);

/* ------------------------------------------------------------------------
 * Arenas (regions): bump allocation over chunks, all freed at once.
 * One arena must not be used by two threads at the same time (the caller
 * serialises; the Python Arena holds a lock). Different arenas are
 * independent.
 * ---------------------------------------------------------------------- */
typedef struct kp_arena kp_arena;
/* chunk_size 0 means 1 MiB; it is rounded up to the page size. */
KP_API kp_arena *kp_arena_create(size_t chunk_size);
/* align 0 means 16; any power of two up to 1 GiB. A request larger than a
 * chunk gets a chunk of its own. size 0 returns a unique pointer. */
KP_API void *kp_arena_alloc(kp_arena *arena, size_t size, size_t align);
/* Free everything at once; the first chunk is kept for reuse. */
KP_API void kp_arena_reset(kp_arena *arena);
KP_API void kp_arena_destroy(kp_arena *arena);
KP_API size_t kp_arena_used(const kp_arena *arena);      /* bytes handed out since reset */
KP_API size_t kp_arena_reserved(const kp_arena *arena);  /* bytes of chunks held */

/* ------------------------------------------------------------------------
 * Statistics
 * ---------------------------------------------------------------------- */
#define KP_STATS_VERSION 3
#define KP_STATS_MAX_CLASSES 160

typedef struct kp_class_stats {
    size_t size;              /* the class's block size */
    size_t in_use;            /* blocks live */
    size_t free_in_central;   /* free blocks in the central lists */
    size_t free_in_tcaches;   /* free blocks in all thread caches */
    uint64_t allocs;
    uint64_t frees;
    size_t spans;             /* spans of pages carved for this class */
} kp_class_stats;

typedef struct kp_stats {
    size_t struct_size;       /* set by the caller to sizeof(kp_stats) */
    uint32_t version;         /* filled: KP_STATS_VERSION */
    uint32_t enabled;         /* 0 when the library was built without counters */
    /* gauges */
    size_t bytes_in_use;      /* class sizes of live blocks, pages of live large blocks */
    size_t bytes_requested;   /* bytes requested for live blocks; a free that does
                                 not tell its size counts as its class size */
    int    requested_exact;   /* 1 while every free since start told its size
                                 (kp_free_sized with the requested size keeps the
                                 figure exact; kp_free and an in-place kp_realloc
                                 of a small block turn it 0) */
    size_t bytes_mapped;      /* bytes of address space mapped for the heap */
    size_t bytes_released;    /* of those, not resident: given back to the OS, or never touched */
    size_t bytes_free_tcaches;   /* free bytes in thread caches */
    size_t bytes_free_central;   /* free bytes in central lists (carved spans) */
    size_t bytes_free_pageheap;  /* free bytes in page-heap spans, not released */
    size_t bytes_metadata;       /* bytes mapped for kpool's own bookkeeping (span, cache
                                    and pool structs, the pagemap's leaves; not in
                                    bytes_mapped, nor the class map's reservation) */
    size_t bytes_small_spans;    /* bytes of spans carved into size classes */
    size_t bytes_span_waste;     /* of those, tail bytes no object fits in */
    size_t bytes_large;          /* bytes of spans holding one large block each */
    size_t bytes_pools;          /* bytes of kp_pool chunks */
    size_t bytes_arenas;         /* bytes of kp_arena chunks */
    /* bytes_mapped == bytes_small_spans + bytes_meshed + bytes_large + bytes_pools
     *                 + bytes_arenas + bytes_free_pageheap + bytes_released, and
     * bytes_small_spans == small bytes in use + bytes_free_tcaches
     *                      + bytes_free_central + bytes_span_waste */
    size_t largest_free_span;    /* bytes of the largest free, unreleased span */
    size_t threads;              /* thread caches alive */
    /* event counters (zeroed by kp_stats_reset) */
    uint64_t allocs;
    uint64_t frees;
    uint64_t tcache_hits;
    uint64_t tcache_misses;
    uint64_t central_fetches;    /* batches moved central -> tcache */
    uint64_t central_returns;    /* batches moved tcache -> central */
    uint64_t pageheap_grows;     /* times the page heap mapped memory */
    uint64_t large_allocs;
    uint64_t lock_acquires;
    uint64_t lock_contended;     /* a try-lock failed and the thread waited */
    uint64_t lock_wait_ns;       /* time spent waiting, timed only when contended */
    uint64_t os_releases;        /* madvise calls that gave pages back */
    double internal_fragmentation;  /* 1 - bytes_requested / bytes_in_use */
    double external_fragmentation;  /* free bytes held that cannot serve the
                                       largest free request, over free bytes held */
    size_t nclasses;
    kp_class_stats classes[KP_STATS_MAX_CLASSES];
    /* version 2 */
    uint64_t uncached_ops;       /* allocs and frees served without a thread cache
                                    (threads exiting, or thread caches unavailable) */
    uint32_t tcaches_unavailable;  /* 1 if no pthread key could be made for kpool
                                      (the process used all PTHREAD_KEYS_MAX): every
                                      thread then runs uncached, through the shared lists */
    /* version 3 */
    size_t bytes_meshed;         /* bytes of small spans whose pages show another span's
                                    physical page (meshing, KPOOL_MESH=1): address space
                                    that costs no memory; not in bytes_small_spans */
    uint64_t meshes;             /* spans meshed into another (event counter) */
} kp_stats;

/* 0 on success; -1 with errno EINVAL if out is NULL or out->struct_size is
 * smaller than the part of the struct before `classes`. Fills as much of the
 * struct as struct_size covers, and nothing past it; nclasses is then the
 * number of rows of `classes` it covers in whole. */
KP_API int kp_stats_get(kp_stats *out);
/* Zero the event counters (not the gauges). */
KP_API void kp_stats_reset(void);
/* Human-readable summary. KPOOL_STATS=1 in the environment prints it to
 * stderr at exit. */
KP_API void kp_stats_print(FILE *out);

/* ------------------------------------------------------------------------
 * Misuse
 * ---------------------------------------------------------------------- */
typedef void (*kp_error_handler)(const char *call, const void *ptr, const char *what);
/* NULL restores the default (print and abort). Returns the previous one.
 * A handler that returns makes the call do nothing. */
KP_API kp_error_handler kp_set_error_handler(kp_error_handler h);

/* Library version string, "0.1.0". */
KP_API const char *kp_version(void);

#ifdef __cplusplus
}
#endif
#endif /* KPOOL_H */
