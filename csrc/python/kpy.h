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
 * Threads and the GIL: kpool._core is correct without the GIL by design. A
 * free-threaded build (Py_GIL_DISABLED) declares Py_mod_gil =
 * Py_MOD_GIL_NOT_USED, so a free-threaded interpreter keeps the GIL off; a
 * GIL build declares Py_MOD_GIL_USED (which changes nothing there). KPY_FT
 * is 1 where the binding protects its objects' state itself: under
 * Py_GIL_DISABLED and in the test-only build KPY_NOGIL_EMULATE (below). In a
 * GIL build (KPY_FT 0) the GIL protects that state as before: the locks
 * taken with kpy_ft_lock are compiled out, so the fast paths (acquire and
 * release, malloc and release, b[i], len, views) take no lock of the
 * binding's, as before it had them. Each object's state has one lock:
 *   - Block: a heap or pool Block's own mutex (mu, a field only where
 *     KPY_FT), an arena Block's arena's mutex (see Arena), guards released,
 *     exports, ptr, size and traced, and every use of the memory through the
 *     Block (b[i], slices, slice assignment, resize). An operation checks and
 *     reads them under the lock, copies out what it needs, and makes Python
 *     objects and raises after unlocking; a slice is copied into a bytes
 *     object made beforehand (made again if a resize changed the size
 *     meanwhile). A view (getbuffer) counts as an export under the lock, so
 *     release(), resize() and Arena.reset() refuse while it is alive, and
 *     bytes(b), memoryview and numpy use the memory through such a view.
 *     release() marks the Block released under the lock and gives the
 *     memory back after unlocking: of two racing releases one frees it.
 *     The bytes themselves are the program's: b[i] = x in one thread and a
 *     read through a view (bytes(b), a memoryview) in another race on the
 *     contents as they would on a bytearray's.
 *   - BufferPool: mu guards the counters (in_use, idle, high_water,
 *     acquires, ...), closed, the kp_pool pointer, waiters and seq, and is
 *     held around every kp_pool call, so close() cannot destroy the kp_pool
 *     while another thread is in kp_pool_alloc or kp_pool_free; a buffer
 *     taken is counted in in_use in the same hold, so close() sees it and
 *     refuses. A waiter at capacity sleeps on cv (which releases mu) and
 *     drops mu around PyErr_CheckSignals. In a GIL build mu is taken only
 *     around waits and wakes (waiters > 0), as before.
 *   - Arena: mu serialises every kp_arena_* call and guards live, traced,
 *     generation and exports (alloc and reset take it in every build, the
 *     Blocks' side under KPY_FT). An arena Block's dead check (its generation
 *     against the arena's) and its use of the memory run under the lock that
 *     reset takes, and reset checks exports under it: a reset never frees
 *     chunks under a b[i], a slice, a resize check or a view being opened.
 *   - Module state: the spare slots and the stress driver's state are
 *     atomic, the live counts atomic adds where KPY_FT (kpy_live_add), the
 *     types and exceptions written once by the exec slot.
 * Lock rules: kpool's locks never nest (a thread holds at most one); no
 * Python code runs and no Python object is made under one (the only C-API
 * calls there are tracemalloc's Track/Untrack in Arena.alloc, reset and
 * Block.resize, which run no Python code and take no kpool lock, and
 * PyMem_RawMalloc); nothing under one waits for another thread except on
 * the kpool core's and tracemalloc's internal locks, which are held briefly
 * and never across a kpool lock. A contended
 * kpy_lock waits with the GIL released (detached in a free-threaded build,
 * so a stop-the-world pause never waits for a thread blocked on a kpool
 * lock); a BufferPool waiter at capacity sleeps with the GIL released (as
 * before) and without mu held (cv releases it).
 * KPY_NOGIL_EMULATE (make -C csrc pytsan; a test build, never shipped):
 * kpy_lock releases the GIL before it takes the mutex and kpy_unlock takes
 * the GIL back after, so everything done under a kpool lock (every access
 * to the objects' shared state and memory, every kp_pool and kp_arena call)
 * runs in several threads at once, as in a free-threaded build, and
 * ThreadSanitizer checks those accesses against each other and against the
 * rest (which runs with the GIL); nested kpool locks abort.
 * No free-threaded CPython was at hand for this design: it is checked by
 * compiling the binding with Py_GIL_DISABLED (against 3.13's headers too,
 * -Werror: tests/test_package.py) and by that TSan build; test_package's
 * free-threaded test (kpool leaves the GIL off) runs on a 3.13t.
 * tests/stress/test_stress_pyobjects.py runs 16 threads on one BufferPool
 * and one Arena with the switch interval at 10 us, checking the invariants,
 * and races close(), reset() and release() against the objects' uses;
 * tests/stress/nogil_races.py holds those races; make -C csrc pytsan runs
 * them under that build.
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
#include <stdlib.h>

#include "kpool.h"

/* Py_NewRef arrived in 3.10. */
#if PY_VERSION_HEX < 0x030A00F0 && !defined(Py_NewRef)
static inline PyObject *kpy_newref(PyObject *o) {
    Py_INCREF(o);
    return o;
}
#define Py_NewRef(o) kpy_newref((PyObject *)(o))
#endif

/* ---- locks (see "Threads and the GIL" above) ---------------------------------- */

#if defined(Py_GIL_DISABLED) && defined(KPY_NOGIL_EMULATE)
#error "KPY_NOGIL_EMULATE is for GIL builds: it releases the GIL that a free-threaded build does not have"
#endif
#if defined(Py_GIL_DISABLED) || defined(KPY_NOGIL_EMULATE)
#define KPY_FT 1
#else
#define KPY_FT 0
#endif

typedef pthread_mutex_t kpy_mutex;

#ifdef KPY_NOGIL_EMULATE
/* Release the GIL as a kpool lock is taken; aborts if it is not held (a
 * kpool lock is held already: they never nest). */
static inline void kpy_emulate_enter(void) {
    if (!PyGILState_Check()) abort();
    (void)PyEval_SaveThread();
}
/* Take the GIL back as the lock is released (this thread's own state:
 * thread-local storage in this library would need dynamic TLS, on which
 * ThreadSanitizer reports false races when threads exit). */
static inline void kpy_emulate_leave(void) { PyEval_RestoreThread(PyGILState_GetThisThreadState()); }
#endif

/* Take m. REQUIRES: the calling thread holds the GIL (is attached) and no
 * other kpool lock. If another thread holds m, wait with the GIL released
 * (detached in a free-threaded build). KPY_NOGIL_EMULATE: release the GIL
 * first, always; kpy_unlock takes it back. */
static inline void kpy_lock(kpy_mutex *m) {
#ifdef KPY_NOGIL_EMULATE
    kpy_emulate_enter();
    pthread_mutex_lock(m);
#else
    if (pthread_mutex_trylock(m) != 0) {
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(m);
        Py_END_ALLOW_THREADS
    }
#endif
}

static inline void kpy_unlock(kpy_mutex *m) {
    pthread_mutex_unlock(m);
#ifdef KPY_NOGIL_EMULATE
    kpy_emulate_leave();
#endif
}

/* kpy_lock and kpy_unlock where KPY_FT; nothing in a GIL build, where the
 * GIL guards what they guard. KPY_NOGIL_EMULATE_UNLOCKED (with
 * KPY_NOGIL_EMULATE: the negative control of make -C csrc pytsan-check)
 * releases and takes back the GIL but not the mutex: the state these guard
 * is then as unprotected as it was before the binding had them, and
 * ThreadSanitizer must report races. */
static inline void kpy_ft_lock(kpy_mutex *m) {
#if defined(KPY_NOGIL_EMULATE_UNLOCKED)
    (void)m;
    kpy_emulate_enter();
#elif KPY_FT
    kpy_lock(m);
#else
    (void)m;
#endif
}

static inline void kpy_ft_unlock(kpy_mutex *m) {
#if defined(KPY_NOGIL_EMULATE_UNLOCKED)
    (void)m;
    kpy_emulate_leave();
#elif KPY_FT
    kpy_unlock(m);
#else
    (void)m;
#endif
}

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

/* Add d to the live count *c. Where KPY_FT an atomic add; otherwise every
 * caller holds the GIL, so a relaxed load and store (no locked instruction
 * on the fast paths) cannot lose an update, and any thread may read the
 * count with an atomic load. */
static inline void kpy_live_add(_Atomic(Py_ssize_t) *c, Py_ssize_t d) {
#if KPY_FT
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
    /* under the Block's lock (kpy_block_lock) where KPY_FT: */
    char *ptr;              /* the memory; meaningless once released */
    Py_ssize_t size;        /* bytes exposed through the buffer protocol */
    Py_ssize_t exports;     /* live Py_buffer views */
    unsigned char released; /* 1 once the memory was given back */
    unsigned char traced;   /* heap and pool blocks: 1 if tracemalloc took ptr (untrack it
                               when it goes back; tracing off then: nothing to call) */
    /* set when the Block is made, then read-only: */
    int kind;               /* KPY_HEAP, KPY_POOL, KPY_ARENA */
    PyObject *owner;        /* NULL (heap), kpy_bufferpool or kpy_arena: strong ref */
    uint64_t generation;    /* arena blocks: the arena's generation at alloc */
    PyObject *weakreflist;  /* weak references (tp_weaklistoffset) */
#if KPY_FT
    kpy_mutex mu;           /* the lock of heap and pool blocks (arena blocks use their arena's) */
#endif
} kpy_block;

typedef struct {
    PyObject_HEAD
    /* read-only after construction: */
    PyTypeObject *block_type;  /* strong ref: the Block type to create */
    PyObject *exhausted;    /* strong ref: kpool.PoolExhausted */
    Py_ssize_t buffer_size; /* size of each Block */
    size_t block_size;      /* buffer_size rounded up to align (kp_pool_block_size) */
    size_t align;
    size_t capacity;        /* 0 = unbounded */
    Py_ssize_t prealloc;
    int zero;
    kpy_state *state;       /* the module's (its live counts); outlives the pool, which
                               holds the Block type, which holds the module */
    /* under mu where KPY_FT, with the GIL otherwise: */
    kp_pool *pool;          /* NULL once closed; every kp_pool call is made under mu (KPY_FT) */
    int closed;
    Py_ssize_t in_use;      /* Blocks handed out and not released */
    Py_ssize_t idle;        /* buffers returned and kept for reuse (estimate after trim) */
    Py_ssize_t high_water;  /* most in_use at once */
    uint64_t acquires, releases, waits, timeouts;
    kp_pool_stats final;    /* the kp_pool's counters when close() destroyed it (stats() after close) */
    /* waiting at capacity: a waiter sleeps on cv with the GIL released;
     * releasers bump seq and signal cv under mu when waiters > 0 (waiters and
     * seq: under mu where KPY_FT; in a GIL build waiters with the GIL, seq
     * under mu) */
    int waiters;
    uint64_t seq;
    uint64_t interrupts;    /* _interrupt_waits() calls (under mu where KPY_FT, else the GIL): an
                               interruptible acquire (acquire_async's helper) gives up once it moves */
    kpy_mutex mu;
    pthread_cond_t cv;
    kpy_spare spare;        /* a dead Block of this pool's memory, for acquire() */
} kpy_bufferpool;

typedef struct {
    PyObject_HEAD
    kp_arena *arena;
    size_t chunk_size;
    kpy_state *state;         /* the module's, as in kpy_bufferpool */
    kpy_mutex mu;             /* serialises every kp_arena_* call; the lock of the arena's Blocks */
    /* under mu (where KPY_FT; alloc and reset take it in every build): */
    uint64_t generation;      /* bumped by reset: older Blocks are dead */
    Py_ssize_t exports;       /* views alive on this arena's Blocks */
    Py_ssize_t live;          /* Blocks of this generation not released (in state->live too) */
    uintptr_t *traced;        /* addresses reported to tracemalloc since the last reset */
    size_t ntraced, captraced;
} kpy_arena;

/* ---- block.c ---------------------------------------------------------------- */

extern PyType_Spec kpy_block_spec;

/* The lock over b's state and memory: a heap or pool Block's own, an arena
 * Block's arena's (so that reset excludes the Blocks' uses). Where KPY_FT
 * only: in a GIL build kpy_block_lock and kpy_block_unlock do nothing. */
#if KPY_FT
static inline kpy_mutex *kpy_block_mutex(kpy_block *b) {
    return b->kind == KPY_ARENA ? &((kpy_arena *)b->owner)->mu : &b->mu;
}
#endif
static inline void kpy_block_lock(kpy_block *b) {
#if KPY_FT
    kpy_ft_lock(kpy_block_mutex(b));
#else
    (void)b;
#endif
}
static inline void kpy_block_unlock(kpy_block *b) {
#if KPY_FT
    kpy_ft_unlock(kpy_block_mutex(b));
#else
    (void)b;
#endif
}

/* Take the wrapper memory left in *spare, or NULL. */
static inline kpy_block *kpy_spare_take(kpy_spare *spare) {
    if (!spare || !atomic_load_explicit(spare, memory_order_relaxed)) return NULL;
    return atomic_exchange_explicit(spare, NULL, memory_order_acquire);
}
/* A Block object from tp_alloc, or NULL with an exception set. */
kpy_block *kpy_block_alloc(PyTypeObject *tp);
/* A new Block over ptr (new reference), or NULL with an exception set; on
 * failure the caller still owns ptr. owner may be NULL (heap blocks). spare
 * (may be NULL) is the slot to take a spare wrapper from. No other thread
 * sees the Block before this returns, so its fields are set without a lock. */
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
#if KPY_FT
    pthread_mutex_init(&b->mu, NULL);
#endif
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
/* Wake the threads waiting in acquire() for a buffer (seq, cv). REQUIRES:
 * mu held where KPY_FT; in a GIL build it takes mu itself. */
void kpy_bufferpool_wake(kpy_bufferpool *self);
/* Take back a pool block's memory (GIL held; no kpool lock held): untracks
 * it (if traced), frees it into the kp_pool, updates the counters, wakes a
 * waiter. Never fails. The pool is open: the buffer counts in in_use, so
 * close() refused. */
static inline void kpy_bufferpool_put(kpy_bufferpool *self, char *ptr, int traced) {
    if (traced) kpy_untrack(ptr);
    kpy_ft_lock(&self->mu);
    kp_pool_free(self->pool, ptr);
    self->in_use--;
    self->idle++;
    self->releases++;
    if (self->waiters > 0) kpy_bufferpool_wake(self);
    kpy_ft_unlock(&self->mu);
    kpy_live_add(&self->state->live[KPY_POOL], -1);
}

/* ---- arena.c ---------------------------------------------------------------- */

extern PyType_Spec kpy_arena_spec;
/* 1 if an arena Block made in generation gen is still valid. REQUIRES: the
 * arena's mu where KPY_FT (the GIL otherwise). */
static inline int kpy_arena_current(PyObject *arena, uint64_t gen) { return ((kpy_arena *)arena)->generation == gen; }
/* An arena Block made in generation gen gives up its memory (released or
 * collected): it no longer counts as live, unless a reset already took it.
 * REQUIRES: the arena's mu where KPY_FT (the GIL otherwise). */
static inline void kpy_arena_block_gone_locked(PyObject *arena, uint64_t gen) {
    kpy_arena *self = (kpy_arena *)arena;
    if (gen == self->generation) {  /* else the reset took it off already */
        self->live--;
        kpy_live_add(&self->state->live[KPY_ARENA], -1);
    }
}
/* Account a view opened (+1) or closed (-1) on one of the arena's Blocks.
 * REQUIRES: the arena's mu where KPY_FT (the GIL otherwise). */
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
