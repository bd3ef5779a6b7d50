/* kpy.h: shared declarations of the CPython binding kpool._core.
 *
 * The bindings are the only part of kpool that includes Python.h (and
 * numpy_handler.c, the separate module kpool._numpy, the only one that
 * includes numpy's headers; it does not use this header). Files:
 *   module.c      module definition, state, exec slot, module functions
 *                 (malloc, stats, stats_reset, trim, thread_flush, stress),
 *                 argument helpers
 *   block.c       kpool.Block: the buffer handed out by malloc, BufferPool
 *                 and Arena
 *   bufferpool.c  kpool.BufferPool over kp_pool_*
 *   arena.c       kpool.Arena over kp_arena_*
 *
 * Ownership: a Block owns its memory until it is released (or collected).
 * A pool Block holds a strong reference to its BufferPool, an arena Block to
 * its Arena, so an owner outlives every Block it handed out. Owners hold no
 * references to their Blocks: there are no reference cycles, and none of
 * these types takes part in the cyclic GC.
 *
 * Threads and the GIL: every entry point runs with the GIL held; the GIL is
 * released only while waiting (BufferPool.acquire at capacity, an Arena
 * lock another thread holds, stress()) and while a BufferPool carves its
 * prealloc buffers. kpool._core declares Py_mod_gil = Py_MOD_GIL_USED, so a
 * free-threaded interpreter turns the GIL on while it is loaded, because
 * these rely on the GIL (issue 16's audit):
 *   - Block: exports, released, ptr and size are plain fields, checked and
 *     changed without a lock. Without the GIL, release() racing release(),
 *     a new view (getbuffer), b[i], bytes(b) or resize() in another thread
 *     frees memory twice or under its user.
 *   - BufferPool: its counters (in_use, idle, high_water, acquires, ...) and
 *     waiters are plain fields, and close() destroys the kp_pool while
 *     another thread may be in kp_pool_alloc or kp_pool_free.
 *   - Arena: exports and generation are read without its lock (a Block's
 *     dead check, getbuffer, reset's check of exports), so a reset could
 *     free chunks under a view being opened or a b[i] in another thread.
 *     The lock serialises the kp_arena calls and the fields marked "under
 *     lock", not the Blocks' use of the memory.
 *   - Module state: the spare slots and the stress driver's state are
 *     atomic, the live counts atomic adds in a free-threaded build
 *     (kpy_live_add; there a collected arena Block takes the arena lock),
 *     the types and exceptions written once by the exec slot: these need no
 *     GIL.
 * Declaring Py_MOD_GIL_NOT_USED would take a lock or critical section per
 * Block around every use of its memory and state (taken before, never held
 * across, anything that may block), one per BufferPool around the kp_pool
 * calls and counters, and resets excluded from the arena Blocks' uses, all
 * compiled in only under Py_GIL_DISABLED so that the GIL build's fast paths
 * pay nothing; not done, for want of a free-threaded CPython to run it on.
 * tests/stress/test_stress_pyobjects.py runs 16 threads on one BufferPool
 * and one Arena with the switch interval at 10 us, checking the invariants.
 * kpool._numpy (numpy_handler.c) needs no GIL and declares so.
 *
 * tracemalloc: every heap Block, pool buffer handed out and arena block is
 * reported to tracemalloc in the domain KPY_TRACEMALLOC_DOMAIN
 * (kpool.TRACEMALLOC_DOMAIN) when it is made, with its size, so a snapshot
 * shows the Python line that allocated it; heap and pool blocks are
 * untracked when their memory goes back (release, collection), arena blocks
 * when their arena is reset or dies (their memory stays the arena's until
 * then). PyTraceMalloc_Track returns -2 at once while tracemalloc is not
 * tracing, which is the whole cost then (measured: README). The address is
 * untracked before its memory is freed and tracked after it was allocated,
 * so a trace never outlives its block even when another thread reuses the
 * address at once.
 *
 * Live Blocks: the module state counts the Blocks that hold memory, by kind
 * (atomics: any thread may make or release one): made +1, released or
 * collected -1, and an arena's blocks all at once when it is reset. The
 * pytest plugin (kpool/pytest_plugin.py) reads them to find tests that leave
 * Blocks alive.
 *
 * Spare wrappers: a heap or pool Block that dies after it was released
 * leaves its object memory in one spare slot (the module state's for heap
 * blocks, its BufferPool's for pool blocks) instead of freeing it; the next
 * malloc()/acquire() takes it back with one atomic exchange and
 * re-initialises it, which skips the object allocator and the zeroing of
 * the generic tp_alloc. A slot holds raw memory, not an object: no
 * reference to the type or the owner. Its owner frees it (module clear, pool
 * dealloc) with PyObject_Free, the Block type's tp_free (it is not a GC type).
 */
#ifndef KPY_H
#define KPY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "kpool.h"

/* Py_NewRef arrived in 3.10. */
#if PY_VERSION_HEX < 0x030A00F0 && !defined(Py_NewRef)
static inline PyObject *kpy_newref(PyObject *o) {
    Py_INCREF(o);
    return o;
}
#define Py_NewRef(o) kpy_newref((PyObject *)(o))
#endif

/* ---- tracemalloc ------------------------------------------------------------- */

/* The tracemalloc domain of kpool's blocks ("kpoo" in ASCII). */
#define KPY_TRACEMALLOC_DOMAIN 0x6B706F6Fu

/* Report p (n bytes) to tracemalloc: 0 tracked, -2 tracemalloc is not
 * tracing, -1 no memory for the trace. -DKPY_NO_TRACEMALLOC compiles the
 * calls out (to measure what they cost). */
static inline int kpy_track(const void *p, size_t n) {
#ifdef KPY_NO_TRACEMALLOC
    (void)p;
    (void)n;
    return -2;
#else
    return PyTraceMalloc_Track(KPY_TRACEMALLOC_DOMAIN, (uintptr_t)p, n);
#endif
}

/* Forget p's trace (nothing if it has none). */
static inline void kpy_untrack(const void *p) {
#ifdef KPY_NO_TRACEMALLOC
    (void)p;
#else
    (void)PyTraceMalloc_Untrack(KPY_TRACEMALLOC_DOMAIN, (uintptr_t)p);
#endif
}

/* ---- module state --------------------------------------------------------- */

enum { KPY_HEAP = 0, KPY_POOL = 1, KPY_ARENA = 2 };

struct kpy_block;
/* One spare Block wrapper's memory, or NULL (see "Spare wrappers" above). */
typedef _Atomic(struct kpy_block *) kpy_spare;

typedef struct {
    PyTypeObject *Block_type;
    PyTypeObject *BufferPool_type;
    PyTypeObject *Arena_type;
    PyObject *Error;            /* kpool.Error */
    PyObject *PoolExhausted;    /* kpool.PoolExhausted(Error) */
    PyObject *CorruptionError;  /* kpool.CorruptionError(Error) */
    kpy_spare heap_spare;       /* a dead heap Block's memory, for malloc() */
    _Atomic(Py_ssize_t) live[3];  /* Blocks holding memory, by kind (KPY_HEAP, KPY_POOL, KPY_ARENA) */
} kpy_state;

/* Add d to the live count *c. In a free-threaded build (Py_GIL_DISABLED)
 * an atomic add; otherwise every caller holds the GIL, so a relaxed load
 * and store (no locked instruction on the fast paths) cannot lose an
 * update, and any thread may read the count with an atomic load. */
static inline void kpy_live_add(_Atomic(Py_ssize_t) *c, Py_ssize_t d) {
#ifdef Py_GIL_DISABLED
    atomic_fetch_add_explicit(c, d, memory_order_relaxed);
#else
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + d, memory_order_relaxed);
#endif
}

extern PyModuleDef kpy_moduledef;

/* The module state of the module that created type tp (one of ours). Never NULL. */
kpy_state *kpy_state_of_type(PyTypeObject *tp);

/* ---- objects ---------------------------------------------------------------- */

typedef struct kpy_block {
    PyObject_HEAD
    char *ptr;              /* the memory; meaningless once released */
    Py_ssize_t size;        /* bytes exposed through the buffer protocol */
    Py_ssize_t exports;     /* live Py_buffer views */
    PyObject *owner;        /* NULL (heap), kpy_bufferpool or kpy_arena: strong ref */
    PyObject *weakreflist;  /* weak references (tp_weaklistoffset) */
    uint64_t generation;    /* arena blocks: the arena's generation at alloc */
    int kind;               /* KPY_HEAP, KPY_POOL, KPY_ARENA */
    unsigned char released; /* 1 once the memory was given back */
    unsigned char traced;   /* heap and pool blocks: 1 if tracemalloc took ptr (untrack it
                               when it goes back; tracing off then: nothing to call) */
} kpy_block;

typedef struct {
    PyObject_HEAD
    kp_pool *pool;          /* NULL once closed */
    PyTypeObject *block_type;  /* strong ref: the Block type to create */
    PyObject *exhausted;    /* strong ref: kpool.PoolExhausted */
    Py_ssize_t buffer_size; /* size of each Block */
    size_t block_size;      /* buffer_size rounded up to align (kp_pool_block_size) */
    size_t align;
    size_t capacity;        /* 0 = unbounded */
    Py_ssize_t prealloc;
    int zero;
    int closed;
    /* counters, all changed with the GIL held */
    Py_ssize_t in_use;      /* Blocks handed out and not released */
    Py_ssize_t idle;        /* buffers returned and kept for reuse (estimate after trim) */
    Py_ssize_t high_water;  /* most in_use at once */
    uint64_t acquires, releases, waits, timeouts;
    kp_pool_stats final;    /* the kp_pool's counters when close() destroyed it (stats() after close) */
    /* waiting at capacity: releasers bump seq and signal cv under mu when
     * waiters > 0; a waiter sleeps on cv with the GIL released */
    int waiters;
    uint64_t seq;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    kpy_spare spare;        /* a dead Block of this pool's memory, for acquire() */
    kpy_state *state;       /* the module's (its live counts); outlives the pool, which
                               holds the Block type, which holds the module */
} kpy_bufferpool;

typedef struct {
    PyObject_HEAD
    kp_arena *arena;
    PyThread_type_lock lock;  /* serialises every kp_arena_* call */
    uint64_t generation;      /* bumped by reset: older Blocks are dead */
    Py_ssize_t exports;       /* views alive on this arena's Blocks */
    size_t chunk_size;
    kpy_state *state;         /* the module's, as in kpy_bufferpool */
    /* under lock: */
    Py_ssize_t live;          /* Blocks of this generation not released (in state->live too) */
    uintptr_t *traced;        /* addresses reported to tracemalloc since the last reset */
    size_t ntraced, captraced;
} kpy_arena;

/* ---- block.c ---------------------------------------------------------------- */

extern PyType_Spec kpy_block_spec;
/* Take the wrapper memory left in *spare, or NULL. */
static inline kpy_block *kpy_spare_take(kpy_spare *spare) {
    if (!spare || !atomic_load_explicit(spare, memory_order_relaxed)) return NULL;
    return atomic_exchange_explicit(spare, NULL, memory_order_acquire);
}
/* A Block object from tp_alloc, or NULL with an exception set. */
kpy_block *kpy_block_alloc(PyTypeObject *tp);
/* A new Block over ptr (new reference), or NULL with an exception set; on
 * failure the caller still owns ptr. owner may be NULL (heap blocks). spare
 * (may be NULL) is the slot to take a spare wrapper from. */
static inline PyObject *kpy_block_new(PyTypeObject *tp, char *ptr, Py_ssize_t size, int kind, PyObject *owner,
                                      uint64_t generation, kpy_spare *spare) {
    kpy_block *b = kpy_spare_take(spare);
    if (b) {
        /* raw memory of a Block: make it an object again (this takes a
         * reference to tp, as tp_alloc does) */
        PyObject_Init((PyObject *)b, tp);
    } else if (!(b = kpy_block_alloc(tp))) {
        return NULL;
    }
    b->ptr = ptr;
    b->size = size;
    b->exports = 0;
    b->kind = kind;
    b->released = 0;
    b->traced = 0;
    b->generation = generation;
    b->weakreflist = NULL;
    Py_XINCREF(owner);
    b->owner = owner;
    return (PyObject *)b;
}
/* Free the memory left in a spare slot, if any (its owner is going away). */
void kpy_spare_clear(kpy_spare *spare);
/* Release b's memory: 0 on success or when already released, -1 with
 * BufferError while views are alive. */
int kpy_block_release(kpy_block *b);

/* ---- bufferpool.c --------------------------------------------------------- */

extern PyType_Spec kpy_bufferpool_spec;
/* Wake the threads waiting in acquire() for a buffer (mu, cv). */
void kpy_bufferpool_wake(kpy_bufferpool *self);
/* Take back a pool block's memory (GIL held): untracks it (if traced),
 * frees it into the kp_pool, updates the counters, wakes a waiter. Never
 * fails. */
static inline void kpy_bufferpool_put(kpy_bufferpool *self, char *ptr, int traced) {
    if (traced) kpy_untrack(ptr);
    kp_pool_free(self->pool, ptr);
    kpy_live_add(&self->state->live[KPY_POOL], -1);
    self->in_use--;
    self->idle++;
    self->releases++;
    if (self->waiters > 0) kpy_bufferpool_wake(self);
}

/* ---- arena.c ---------------------------------------------------------------- */

extern PyType_Spec kpy_arena_spec;
/* 1 if an arena Block made in generation gen is still valid. */
static inline int kpy_arena_current(PyObject *arena, uint64_t gen) { return ((kpy_arena *)arena)->generation == gen; }
/* An arena Block made in generation gen gives up its memory (released or
 * collected): it no longer counts as live, unless a reset already took it. */
void kpy_arena_block_gone(PyObject *arena, uint64_t gen);
/* Account a view opened (+1) or closed (-1) on one of the arena's Blocks. */
static inline void kpy_arena_export(PyObject *arena, int delta) { ((kpy_arena *)arena)->exports += delta; }

/* ---- module.c: argument helpers -------------------------------------------- */

/* Parse a METH_FASTCALL|METH_KEYWORDS call: names is NULL-terminated; the
 * first npos may be given by position, the rest only by keyword; the first
 * nreq are required. out[i] gets a borrowed reference or stays NULL.
 * 0 on success, -1 with TypeError. */
int kpy_parse_args(const char *fname, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                   const char *const *names, int npos, int nreq, PyObject **out);
/* A size argument: an int (or __index__) >= 0 (> 0 unless allow_zero).
 * 0 on success; -1 with TypeError (not an int), ValueError (negative or
 * zero) or OverflowError (beyond Py_ssize_t). */
int kpy_size_arg(PyObject *o, const char *name, int allow_zero, Py_ssize_t *out);
/* An alignment: an int, a power of two, at most max. 0 or -1 as above. */
int kpy_align_arg(PyObject *o, const char *name, size_t max, size_t *out);
/* A timeout: None (*forever = 1) or a real number >= 0 in seconds.
 * 0 or -1 (TypeError, ValueError for negative or NaN, OverflowError for huge). */
int kpy_timeout_arg(PyObject *o, double *seconds, int *forever);
/* MemoryError "<what>: cannot allocate <bytes> bytes". Returns NULL. */
PyObject *kpy_no_memory(const char *what, size_t bytes);
/* Set dict[key] = value and drop the reference to value (which may be NULL
 * with an exception set). 0 on success, -1 on error. */
int kpy_dict_steal(PyObject *dict, const char *key, PyObject *value);

#endif /* KPY_H */
