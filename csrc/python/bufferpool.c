/* bufferpool.c: kpool.BufferPool, fixed-size buffers over a kp_pool.
 *
 * acquire() takes a block from the kp_pool and wraps it in a Block that
 * holds a strong reference to the pool; the Block gives it back through
 * kpy_bufferpool_put. The capacity is the kp_pool's (exact across threads).
 *
 * Locking (kpy.h, "Threads and the GIL"): where KPY_FT, mu guards the
 * counters, closed, pool, waiters and seq, and is held around every kp_pool
 * call; acquire() counts the buffer in in_use in the same hold as its
 * kp_pool_alloc, so close() (under mu) either sees it and refuses, or ran
 * first and acquire() finds the pool closed. Exceptions are raised after mu
 * is released. In a GIL build the GIL guards all of that, and mu only seq
 * and the waits.
 *
 * Waiting at capacity (timeout None or > 0): the waiter snapshots seq, then
 * sleeps on cv with the GIL released until a releaser bumps seq or a slice
 * of at most 50 ms passes; then, with the GIL and without mu, it runs
 * PyErr_CheckSignals (so Ctrl-C interrupts it), checks `closed` and tries
 * again. Releasers take mu for the wake only when waiters > 0 (in a GIL
 * build; where KPY_FT they hold it anyway), so the GIL build's fast path
 * takes no lock of ours.
 *
 * Invariants (under mu where KPY_FT, else with the GIL): in_use == buffers
 * taken from the kp_pool and not given back (Blocks of this pool not
 * released, plus an acquire() between its kp_pool_alloc and its Block);
 * in_use <= capacity when bounded; closed implies in_use == 0 and pool NULL.
 */
#include "kpy.h"

#include <errno.h>
#include <math.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/sysinfo.h>
#include <time.h>
#include <unistd.h>

#define WAIT_SLICE_NS 50000000LL  /* longest sleep between signal checks */

/* Monotonic time in ns. */
static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void kpy_bufferpool_wake(kpy_bufferpool *self) {
#if !KPY_FT
    pthread_mutex_lock(&self->mu);  /* where KPY_FT the caller holds it */
#endif
    self->seq++;
    pthread_cond_broadcast(&self->cv);
#if !KPY_FT
    pthread_mutex_unlock(&self->mu);
#endif
}

/* Why an acquire got no buffer (raised after mu is released). */
enum { GOT = 0, E_CLOSED, E_NO_CHUNK, E_EXHAUSTED, E_TIMED_OUT, E_RAISED, E_INTERRUPTED };

/* Raise the exception for why (E_RAISED: set already). Returns NULL. */
static PyObject *acquire_error(kpy_bufferpool *self, int why) {
    switch (why) {
    case E_CLOSED: PyErr_SetString(PyExc_ValueError, "operation on a closed BufferPool"); break;
    case E_NO_CHUNK:
        PyErr_Format(PyExc_MemoryError,
                     "BufferPool.acquire: cannot allocate a buffer of %zd bytes (no memory for a new chunk)",
                     self->buffer_size);
        break;
    case E_EXHAUSTED:
        PyErr_Format(self->exhausted, "BufferPool exhausted: all %zu buffers are in use", self->capacity);
        break;
    case E_TIMED_OUT:
        PyErr_Format(self->exhausted, "BufferPool exhausted: all %zu buffers are in use (timed out waiting)",
                     self->capacity);
        break;
    default: break;
    }
    return NULL;
}

/* 1 if the pool is closed. REQUIRES: mu where KPY_FT. */
static inline int is_closed(kpy_bufferpool *self) { return self->closed || !self->pool; }

/* Raise ValueError if the pool is closed; -1 then, else 0. Takes mu. */
static int check_open(kpy_bufferpool *self) {
    kpy_ft_lock(&self->mu);
    int closed = is_closed(self);
    kpy_ft_unlock(&self->mu);
    return closed ? (acquire_error(self, E_CLOSED), -1) : 0;
}

/* Sleep with the GIL released until seq moves past snap or until_ns passes.
 * REQUIRES: the GIL held on entry (released and taken back); mu held where
 * KPY_FT (cv releases it while sleeping), not held in a GIL build. */
static void wait_for_release(kpy_bufferpool *self, uint64_t snap, int64_t until_ns) {
    struct timespec ts = {(time_t)(until_ns / 1000000000LL), (long)(until_ns % 1000000000LL)};
#ifndef KPY_NOGIL_EMULATE  /* there kpy_lock released the GIL already */
    Py_BEGIN_ALLOW_THREADS
#endif
#if !KPY_FT
    pthread_mutex_lock(&self->mu);
#endif
    while (self->seq == snap) {
        if (pthread_cond_timedwait(&self->cv, &self->mu, &ts) == ETIMEDOUT) break;
    }
#if !KPY_FT
    pthread_mutex_unlock(&self->mu);
#endif
#ifndef KPY_NOGIL_EMULATE
    Py_END_ALLOW_THREADS
#endif
}

/* One block from the pool after kp_pool_alloc just failed (errno says why),
 * waiting as the timeout says; with interrupt_at, also giving up once
 * interrupts differs from it. Returns the block, or NULL with *why set.
 * REQUIRES: pool open; mu held where KPY_FT (dropped around the waits and
 * the signal check: the pool may be closed when it returns NULL), the GIL
 * otherwise. */
__attribute__((noinline)) static char *take_block_slow(kpy_bufferpool *self, double timeout, int forever,
                                                       const uint64_t *interrupt_at, int *why) {
    char *p = NULL;
    if (errno != ENOBUFS) return *why = E_NO_CHUNK, NULL;
    if (!forever && timeout <= 0.0) return *why = E_EXHAUSTED, NULL;

    kp_pool_note_wait(self->pool);
    self->waits++;
    int64_t deadline = forever ? INT64_MAX : now_ns() + (int64_t)(timeout * 1e9);
    self->waiters++;
    for (;;) {
        if (interrupt_at && self->interrupts != *interrupt_at) {   /* before taking a buffer nobody awaits */
            *why = E_INTERRUPTED;
            break;
        }
        uint64_t snap = self->seq;
        p = kp_pool_alloc(self->pool);
        if (p) break;
        if (errno != ENOBUFS) {
            *why = E_NO_CHUNK;
            break;
        }
        int64_t now = now_ns();
        if (now >= deadline) {
            self->timeouts++;
            *why = E_TIMED_OUT;
            break;
        }
        int64_t until = deadline - now > WAIT_SLICE_NS ? now + WAIT_SLICE_NS : deadline;
        wait_for_release(self, snap, until);
        /* signal handlers run Python code: not under mu */
        kpy_ft_unlock(&self->mu);
        int sig = PyErr_CheckSignals();
        kpy_ft_lock(&self->mu);
        if (sig < 0) {
            *why = E_RAISED;
            break;
        }
        if (is_closed(self)) {
            *why = E_CLOSED;
            break;
        }
    }
    self->waiters--;
    return p;
}

static const char *const acquire_kw[] = {"timeout", NULL};

/* Count a buffer handed out; returns 1 if it was counted as idle before.
 * REQUIRES: mu where KPY_FT. */
static inline int count_acquire(kpy_bufferpool *self) {
    int was_idle = self->idle > 0;
    self->acquires++;
    self->in_use++;
    if (was_idle) self->idle--;
    if (self->in_use > self->high_water) self->high_water = self->in_use;
    return was_idle;
}

static PyObject *acquire_block(kpy_bufferpool *self, double timeout, int forever, const uint64_t *interrupt_at);

static PyObject *bufferpool_acquire(kpy_bufferpool *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    double timeout = 0.0;
    int forever = 0;
    if (nargs != 0 || kwnames) {
        PyObject *o[1] = {NULL};
        if (kpy_parse_args("acquire", args, nargs, kwnames, acquire_kw, 1, 0, o) < 0) return NULL;
        if (o[0] && kpy_timeout_arg(o[0], &timeout, &forever) < 0) return NULL;
    }
    return acquire_block(self, timeout, forever, NULL);
}

/* _acquire_interruptible(timeout, since): acquire(timeout), but None once
 * _interrupt_waits() was called after `since` (a value of _interrupts) was
 * read. For acquire_async's helper thread (kpool/_aio.py). */
static PyObject *bufferpool_acquire_interruptible(kpy_bufferpool *self, PyObject *const *args, Py_ssize_t nargs) {
    double timeout = 0.0;
    int forever = 0;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "_acquire_interruptible(timeout, since) takes 2 arguments");
        return NULL;
    }
    if (kpy_timeout_arg(args[0], &timeout, &forever) < 0) return NULL;
    unsigned long long since = PyLong_AsUnsignedLongLong(args[1]);
    if (since == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    uint64_t at = (uint64_t)since;
    return acquire_block(self, timeout, forever, &at);
}

/* Make every interruptible acquire in progress give up (None). */
static PyObject *bufferpool_interrupt_waits(kpy_bufferpool *self, PyObject *unused) {
    kpy_ft_lock(&self->mu);
    self->interrupts++;
    if (self->waiters > 0) kpy_bufferpool_wake(self);
    kpy_ft_unlock(&self->mu);
    Py_RETURN_NONE;
}

static PyObject *get_interrupts(kpy_bufferpool *self, void *c) {
    kpy_ft_lock(&self->mu);
    uint64_t n = self->interrupts;
    kpy_ft_unlock(&self->mu);
    return PyLong_FromUnsignedLongLong(n);
}

static PyObject *acquire_block(kpy_bufferpool *self, double timeout, int forever, const uint64_t *interrupt_at) {
    char *p = NULL;
    int why = GOT;
    kpy_ft_lock(&self->mu);
    if (is_closed(self)) {
        why = E_CLOSED;
    } else if (interrupt_at && self->interrupts != *interrupt_at) {
        why = E_INTERRUPTED;
    } else {
        p = kp_pool_alloc(self->pool);  /* the fast path: a free buffer at hand */
        if (!p) p = take_block_slow(self, timeout, forever, interrupt_at, &why);
    }
#if KPY_FT
    /* counted in the same hold as the kp_pool_alloc, so close() sees it */
    int was_idle = p ? count_acquire(self) : 0;
#endif
    kpy_ft_unlock(&self->mu);
    if (!p && why == E_INTERRUPTED) Py_RETURN_NONE;
    if (!p) return acquire_error(self, why);
    if (self->zero) memset(p, 0, (size_t)self->buffer_size);
    PyObject *b = kpy_block_new(self->block_type, p, self->buffer_size, KPY_POOL, (PyObject *)self, 0, &self->spare);
    if (!b) {  /* no Block: the buffer goes back (the pool is open: it counts in in_use where KPY_FT) */
        kpy_ft_lock(&self->mu);
        kp_pool_free(self->pool, p);
#if KPY_FT
        self->acquires--;
        self->in_use--;
        if (was_idle) self->idle++;
        if (self->waiters > 0) kpy_bufferpool_wake(self);
#endif
        kpy_ft_unlock(&self->mu);
        return NULL;
    }
#if !KPY_FT
    (void)count_acquire(self);  /* with the GIL, once the Block exists (nothing to undo) */
#endif
    kpy_live_add(&self->state->live[KPY_POOL], 1);
    ((kpy_block *)b)->traced = kpy_track(p, (size_t)self->buffer_size) == 0;  /* not shared yet */
    return b;
}

static PyObject *bufferpool_release(kpy_bufferpool *self, PyObject *block) {
    if (Py_TYPE(block) != self->block_type) {
        PyErr_Format(PyExc_TypeError, "release() expects a kpool.Block, not %.100s", Py_TYPE(block)->tp_name);
        return NULL;
    }
    kpy_block *b = (kpy_block *)block;
    if (b->kind != KPY_POOL || b->owner != (PyObject *)self) {
        PyErr_SetString(PyExc_ValueError, b->kind == KPY_POOL ? "this Block belongs to another BufferPool"
                                                              : "this Block did not come from a BufferPool");
        return NULL;
    }
    if (kpy_block_release(b) < 0) return NULL;
    Py_RETURN_NONE;
}

/* Pool statistics as a dict (new reference) or NULL. */
static PyObject *bufferpool_stats(kpy_bufferpool *self, PyObject *unused) {
    kp_pool_stats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    int rc = 0;
    kpy_ft_lock(&self->mu);  /* one snapshot: the counters and the kp_pool's together */
    if (self->pool) rc = kp_pool_stats_get(self->pool, &st);
    else st = self->final;  /* closed: the counters as close() left them, no memory */
    uint64_t acquires = self->acquires, releases = self->releases, waits = self->waits, timeouts = self->timeouts;
    Py_ssize_t high_water = self->high_water, in_use = self->in_use, idle = self->idle;
    int closed = self->closed;
    kpy_ft_unlock(&self->mu);
    if (rc < 0) return PyErr_SetFromErrno(PyExc_OSError);
    uint64_t pre = (uint64_t)self->prealloc;
    uint64_t misses = st.misses > pre ? st.misses - pre : 0;
    if (misses > acquires) misses = acquires;
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    if (kpy_dict_steal(d, "acquires", PyLong_FromUnsignedLongLong(acquires)) < 0 ||
        kpy_dict_steal(d, "releases", PyLong_FromUnsignedLongLong(releases)) < 0 ||
        kpy_dict_steal(d, "hits", PyLong_FromUnsignedLongLong(acquires - misses)) < 0 ||
        kpy_dict_steal(d, "misses", PyLong_FromUnsignedLongLong(misses)) < 0 ||
        kpy_dict_steal(d, "high_water", PyLong_FromSsize_t(high_water)) < 0 ||
        kpy_dict_steal(d, "waits", PyLong_FromUnsignedLongLong(waits)) < 0 ||
        kpy_dict_steal(d, "timeouts", PyLong_FromUnsignedLongLong(timeouts)) < 0 ||
        kpy_dict_steal(d, "exhausted", PyLong_FromUnsignedLongLong(st.exhausted)) < 0 ||
        kpy_dict_steal(d, "in_use", PyLong_FromSsize_t(in_use)) < 0 ||
        kpy_dict_steal(d, "idle", PyLong_FromSsize_t(idle)) < 0 ||
        kpy_dict_steal(d, "prealloc", PyLong_FromSsize_t(self->prealloc)) < 0 ||
        kpy_dict_steal(d, "capacity", self->capacity ? PyLong_FromSize_t(self->capacity) : Py_NewRef(Py_None)) < 0 ||
        kpy_dict_steal(d, "buffer_size", PyLong_FromSsize_t(self->buffer_size)) < 0 ||
        kpy_dict_steal(d, "block_size", PyLong_FromSize_t(self->block_size)) < 0 ||
        kpy_dict_steal(d, "align", PyLong_FromSize_t(self->align)) < 0 ||
        kpy_dict_steal(d, "bytes_mapped", PyLong_FromSize_t(st.bytes_mapped)) < 0 ||
        kpy_dict_steal(d, "chunks", PyLong_FromSize_t(st.chunks)) < 0 ||
        kpy_dict_steal(d, "free_blocks", PyLong_FromSize_t(st.free_blocks)) < 0 ||
        kpy_dict_steal(d, "pool_allocs", PyLong_FromUnsignedLongLong(st.allocs)) < 0 ||
        kpy_dict_steal(d, "pool_frees", PyLong_FromUnsignedLongLong(st.frees)) < 0 ||
        kpy_dict_steal(d, "pool_hits", PyLong_FromUnsignedLongLong(st.hits)) < 0 ||
        kpy_dict_steal(d, "pool_misses", PyLong_FromUnsignedLongLong(st.misses)) < 0 ||
        kpy_dict_steal(d, "pool_high_water", PyLong_FromSize_t(st.high_water)) < 0 ||
        kpy_dict_steal(d, "closed", PyBool_FromLong(closed)) < 0) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

static PyObject *bufferpool_trim(kpy_bufferpool *self, PyObject *unused) {
    size_t released = 0;
    kpy_ft_lock(&self->mu);
    int closed = is_closed(self);
    if (!closed) {
        released = kp_pool_trim(self->pool);
        kp_pool_stats st;
        st.struct_size = sizeof st;
        /* whole chunks went, and the idle buffers they held with them: the
         * pool's free blocks (with any carved ahead) bound what is left */
        if (released > 0 && kp_pool_stats_get(self->pool, &st) == 0 && (size_t)self->idle > st.free_blocks)
            self->idle = (Py_ssize_t)st.free_blocks;
    }
    kpy_ft_unlock(&self->mu);
    if (closed) return acquire_error(self, E_CLOSED);
    return PyLong_FromSize_t(released);
}

/* Close: 0 on success (also when closed already), -1 with BufferError. */
static int do_close(kpy_bufferpool *self) {
    Py_ssize_t in_use = 0;
    kpy_ft_lock(&self->mu);  /* no kp_pool call of another thread is in progress */
    if (!self->closed && (in_use = self->in_use) == 0) {
        /* keep the counters: stats() after close still tells hits from misses */
        memset(&self->final, 0, sizeof self->final);
        self->final.struct_size = sizeof self->final;
        (void)kp_pool_stats_get(self->pool, &self->final);
        self->final.bytes_mapped = self->final.chunks = self->final.live = self->final.free_blocks = 0;
        self->closed = 1;
        kp_pool_destroy(self->pool);
        self->pool = NULL;
        self->idle = 0;
        if (self->waiters > 0) kpy_bufferpool_wake(self);  /* woken waiters see closed and raise ValueError */
    }
    kpy_ft_unlock(&self->mu);
    if (in_use > 0) {
        PyErr_Format(PyExc_BufferError, "cannot close a BufferPool while %zd buffer%s %s in use", in_use,
                     in_use == 1 ? "" : "s", in_use == 1 ? "is" : "are");
        return -1;
    }
    return 0;
}

static PyObject *bufferpool_close(kpy_bufferpool *self, PyObject *unused) {
    if (do_close(self) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *bufferpool_enter(kpy_bufferpool *self, PyObject *unused) {
    if (check_open(self) < 0) return NULL;
    return Py_NewRef((PyObject *)self);
}

/* A block that raised keeps its exception: buffers it left in use (often
 * held by its own frame) do not turn it into a BufferError; the pool then
 * stays open and goes with its last buffer. */
static PyObject *bufferpool_exit(kpy_bufferpool *self, PyObject *args) {
    PyObject *exc_type = PyTuple_GET_SIZE(args) > 0 ? PyTuple_GET_ITEM(args, 0) : Py_None;
    if (do_close(self) < 0) {
        if (exc_type == Py_None || !PyErr_ExceptionMatches(PyExc_BufferError)) return NULL;
        PyErr_Clear();
    }
    Py_RETURN_FALSE;
}

static PyObject *get_buffer_size(kpy_bufferpool *self, void *c) { return PyLong_FromSsize_t(self->buffer_size); }
static PyObject *get_capacity(kpy_bufferpool *self, void *c) {
    return self->capacity ? PyLong_FromSize_t(self->capacity) : Py_NewRef(Py_None);
}
/* One counter or flag read under mu. */
static Py_ssize_t read_locked(kpy_bufferpool *self, const Py_ssize_t *field) {
    kpy_ft_lock(&self->mu);
    Py_ssize_t v = *field;
    kpy_ft_unlock(&self->mu);
    return v;
}

static PyObject *get_in_use(kpy_bufferpool *self, void *c) { return PyLong_FromSsize_t(read_locked(self, &self->in_use)); }
static PyObject *get_idle(kpy_bufferpool *self, void *c) { return PyLong_FromSsize_t(read_locked(self, &self->idle)); }
static PyObject *get_align(kpy_bufferpool *self, void *c) { return PyLong_FromSize_t(self->align); }
static PyObject *get_zero(kpy_bufferpool *self, void *c) { return PyBool_FromLong(self->zero); }
static PyObject *get_closed(kpy_bufferpool *self, void *c) {
    kpy_ft_lock(&self->mu);
    int closed = self->closed;
    kpy_ft_unlock(&self->mu);
    return PyBool_FromLong(closed);
}

static PyObject *bufferpool_repr(kpy_bufferpool *self) {
    kpy_ft_lock(&self->mu);
    int closed = self->closed;
    Py_ssize_t in_use = self->in_use, idle = self->idle;
    kpy_ft_unlock(&self->mu);
    if (closed) return PyUnicode_FromFormat("<kpool.BufferPool buffer_size=%zd, closed>", self->buffer_size);
    if (self->capacity)
        return PyUnicode_FromFormat("<kpool.BufferPool buffer_size=%zd, capacity=%zu, in_use=%zd, idle=%zd>",
                                    self->buffer_size, self->capacity, in_use, idle);
    return PyUnicode_FromFormat("<kpool.BufferPool buffer_size=%zd, in_use=%zd, idle=%zd>", self->buffer_size, in_use,
                                idle);
}

/* ---- construction ------------------------------------------------------------ */

/* Bytes this machine could ever back with memory: physical memory plus swap,
 * and no more than RLIMIT_AS allows. 0 if unknown. */
static size_t backing_bytes(void) {
    size_t total = 0;
    long pages = sysconf(_SC_PHYS_PAGES), pg = sysconf(_SC_PAGESIZE);
    if (pages > 0 && pg > 0) total = (size_t)pages * (size_t)pg;
    struct sysinfo si;
    if (total && sysinfo(&si) == 0) total += (size_t)si.totalswap * (si.mem_unit ? si.mem_unit : 1);
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && (total == 0 || (size_t)rl.rlim_cur < total))
        total = (size_t)rl.rlim_cur;
    return total;
}

/* 0 if n blocks of block_size bytes can be backed, else -1 with MemoryError. */
static int check_prealloc(Py_ssize_t n, size_t block_size) {
    size_t limit = backing_bytes(), need;
    if (__builtin_mul_overflow((size_t)n, block_size, &need)) {
        PyErr_Format(PyExc_MemoryError, "BufferPool: prealloc=%zd buffers of %zu bytes need more than 2**64 bytes", n,
                     block_size);
        return -1;
    }
    if (need > ((size_t)1 << 47) || (limit && need > limit)) {
        PyErr_Format(PyExc_MemoryError,
                     "BufferPool: cannot preallocate %zd buffers of %zu bytes: %zu bytes is more than this machine "
                     "can back (%zu bytes of memory and swap)", n, block_size, need, limit);
        return -1;
    }
    return 0;
}

#define PREALLOC_BATCH_BYTES ((size_t)16 << 20)  /* carved with the GIL released between signal checks */

/* Carve n buffers, then give them all back, so that the pool holds them
 * idle. The buffers carved so far are chained through their first word (no
 * array of n pointers). Each batch of up to 16 MiB is carved with the GIL
 * released; between batches the signal handlers run, so Ctrl-C stops a long
 * prealloc. On failure everything carved is given back and -1 returns with
 * KeyboardInterrupt (or whatever a handler raised) or MemoryError set. */
static int carve_prealloc(kpy_bufferpool *self, Py_ssize_t n) {
    kp_pool *pool = self->pool;
    size_t bs = self->block_size;
    Py_ssize_t batch = (Py_ssize_t)(PREALLOC_BATCH_BYTES / bs);
    if (batch < 1) batch = 1;
    if (batch > 65536) batch = 65536;
    char *head = NULL;
    Py_ssize_t done = 0;
    int oom = 0, interrupted = 0;
    while (done < n) {
        Py_ssize_t stop = n - done < batch ? n : done + batch;
        Py_BEGIN_ALLOW_THREADS
        for (; done < stop; done++) {
            char *p = kp_pool_alloc(pool);
            if (!p) {
                oom = 1;
                break;
            }
            memcpy(p, &head, sizeof head);  /* the chain; kp_pool_free overwrites it */
            head = p;
        }
        Py_END_ALLOW_THREADS
        if (oom) break;
        if (done < n && PyErr_CheckSignals() < 0) {
            interrupted = 1;
            break;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    while (head) {  /* newest first, so that acquire hands them out oldest first */
        char *next;
        memcpy(&next, head, sizeof next);
        kp_pool_free(pool, head);
        head = next;
    }
    Py_END_ALLOW_THREADS
    if (oom) {
        PyErr_Format(PyExc_MemoryError, "BufferPool: cannot preallocate %zd buffers of %zu bytes (out of memory after %zd)",
                     n, bs, done);
        return -1;
    }
    return interrupted ? -1 : 0;
}

static PyObject *bufferpool_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"buffer_size", "capacity", "prealloc", "zero", "align", NULL};
    PyObject *o_size, *o_cap = Py_None, *o_pre = NULL, *o_align = NULL;
    int zero = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|$OOpO:BufferPool", kwlist, &o_size, &o_cap, &o_pre, &zero, &o_align))
        return NULL;
    Py_ssize_t size, capacity = 0, prealloc = 0;
    size_t align = 64;
    if (kpy_size_arg(o_size, "buffer_size", 0, &size) < 0) return NULL;
    if ((size_t)size > KP_POOL_MAX_BLOCK) {
        PyErr_Format(PyExc_ValueError, "buffer_size %zd is above the limit of %zu bytes", size, (size_t)KP_POOL_MAX_BLOCK);
        return NULL;
    }
    if (o_cap != Py_None) {
        if (kpy_size_arg(o_cap, "capacity", 0, &capacity) < 0) return NULL;
        if ((uint64_t)capacity > ((uint64_t)1 << 40)) {
            PyErr_SetString(PyExc_ValueError, "capacity is above the limit of 2**40 buffers");
            return NULL;
        }
    }
    if (o_pre && kpy_size_arg(o_pre, "prealloc", 1, &prealloc) < 0) return NULL;
    if (o_align && kpy_align_arg(o_align, "align", KP_POOL_MAX_ALIGN, &align) < 0) return NULL;
    if (capacity && prealloc > capacity) {
        PyErr_Format(PyExc_ValueError, "prealloc (%zd) is larger than capacity (%zd)", prealloc, capacity);
        return NULL;
    }
    kp_pool *pool = kp_pool_create((size_t)size, align, (size_t)capacity);
    if (!pool) {
        if (errno == EINVAL) PyErr_SetString(PyExc_ValueError, "invalid BufferPool arguments");
        else PyErr_Format(PyExc_MemoryError, "BufferPool: cannot allocate a pool of %zd-byte buffers", size);
        return NULL;
    }
    /* prealloc more than the machine can back fails up front, before any of
     * it is mapped, instead of after a long loop */
    if (prealloc > 0 && check_prealloc(prealloc, kp_pool_block_size(pool)) < 0) {
        kp_pool_destroy(pool);
        return NULL;
    }
    kpy_state *st = kpy_state_of_type(type);
    kpy_bufferpool *self = (kpy_bufferpool *)type->tp_alloc(type, 0);
    if (!self) {
        kp_pool_destroy(pool);
        return NULL;
    }
    self->pool = pool;
    self->state = st;
    self->block_type = (PyTypeObject *)Py_NewRef((PyObject *)st->Block_type);
    self->exhausted = Py_NewRef(st->PoolExhausted);
    self->buffer_size = size;
    self->block_size = kp_pool_block_size(pool);
    self->align = align;
    self->capacity = (size_t)capacity;
    self->zero = zero;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&self->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&self->mu, NULL);

    if (prealloc > 0) {
        if (carve_prealloc(self, prealloc) < 0) {
            Py_DECREF(self);
            return NULL;
        }
        self->prealloc = prealloc;
        self->idle = prealloc;
    }
    return (PyObject *)self;
}

static void bufferpool_dealloc(kpy_bufferpool *self) {
    PyTypeObject *tp = Py_TYPE(self);
    /* every Block holds a reference to its pool, so in_use == 0 here */
    if (self->pool) kp_pool_destroy(self->pool);
    self->pool = NULL;
    if (self->block_type) {
        pthread_mutex_destroy(&self->mu);
        pthread_cond_destroy(&self->cv);
    }
    Py_CLEAR(self->block_type);
    Py_CLEAR(self->exhausted);
    kpy_spare_clear(&self->spare);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyMethodDef bufferpool_methods[] = {
    {"_acquire_interruptible", (PyCFunction)(void (*)(void))bufferpool_acquire_interruptible, METH_FASTCALL,
     "_acquire_interruptible($self, timeout, since, /)\n--\n\n"
     "acquire(timeout) that returns None once _interrupt_waits() is called after\n"
     "_interrupts read `since` (internal: acquire_async's helper thread)."},
    {"_interrupt_waits", (PyCFunction)(void (*)(void))bufferpool_interrupt_waits, METH_NOARGS,
     "_interrupt_waits($self, /)\n--\n\nMake the _acquire_interruptible calls in progress return None (internal)."},
    {"acquire", (PyCFunction)(void (*)(void))bufferpool_acquire, METH_FASTCALL | METH_KEYWORDS,
     "acquire($self, /, timeout=0.0)\n--\n\n"
     "Return a Block of buffer_size bytes from the pool.\n\n"
     "The timeout matters only at capacity. The default, 0, never waits: it\n"
     "raises kpool.PoolExhausted at once when all `capacity` buffers are in use\n"
     "(unlike queue.Queue.get, which blocks by default: a full pool usually\n"
     "means a leak or an overload, and failing fast shows it). None waits until\n"
     "another thread releases one; a positive number waits at most that many\n"
     "seconds, then raises PoolExhausted. PoolExhausted is a TimeoutError.\n"
     "Waiting releases the GIL and can be interrupted by Ctrl-C. In asyncio\n"
     "code use `await pool.acquire_async(timeout=...)`, which waits without\n"
     "blocking the event loop. A closed pool raises ValueError."},
    {"release", (PyCFunction)(void (*)(void))bufferpool_release, METH_O,
     "release($self, block, /)\n--\n\nGive a Block of this pool back (same as block.release()). A Block of\n"
     "another pool or from kpool.malloc raises ValueError."},
    {"stats", (PyCFunction)(void (*)(void))bufferpool_stats, METH_NOARGS,
     "stats($self, /)\n--\n\nA dict: acquires, releases, hits (reused buffers), misses (new buffers),\n"
     "high_water, waits, timeouts, exhausted, in_use, idle, capacity, buffer_size,\n"
     "block_size, align, bytes_mapped, chunks, free_blocks (carved and not in use:\n"
     "idle buffers and any carved ahead), and the raw kp_pool counters."},
    {"trim", (PyCFunction)(void (*)(void))bufferpool_trim, METH_NOARGS,
     "trim($self, /)\n--\n\nGive the memory of idle buffers back; returns the bytes released."},
    {"close", (PyCFunction)(void (*)(void))bufferpool_close, METH_NOARGS,
     "close($self, /)\n--\n\nFree the pool's memory. BufferError while buffers are in use; idempotent.\n"
     "A closed pool raises ValueError on acquire()."},
    {"__enter__", (PyCFunction)(void (*)(void))bufferpool_enter, METH_NOARGS, "Return the pool itself."},
    {"__exit__", (PyCFunction)(void (*)(void))bufferpool_exit, METH_VARARGS,
     "Close the pool (BufferError if buffers are still in use). If the block\n"
     "raised, its exception propagates instead, and with buffers in use the\n"
     "pool stays open."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef bufferpool_getset[] = {
    {"buffer_size", (getter)get_buffer_size, NULL, "Size in bytes of each buffer.", NULL},
    {"capacity", (getter)get_capacity, NULL, "Most buffers in use at once, or None when unbounded.", NULL},
    {"in_use", (getter)get_in_use, NULL, "Buffers acquired and not yet released.", NULL},
    {"_interrupts", (getter)get_interrupts, NULL, "How many times _interrupt_waits() was called (internal).", NULL},
    {"idle", (getter)get_idle, NULL,
     "Buffers released (or preallocated) and kept for reuse; after trim(), those\n"
     "its kept chunks hold (counted by the pool's free blocks: at most as many as before).", NULL},
    {"align", (getter)get_align, NULL, "Every buffer's address is a multiple of this.", NULL},
    {"zero", (getter)get_zero, NULL, "True if every acquired buffer is zeroed.", NULL},
    {"closed", (getter)get_closed, NULL, "True once close() succeeded.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyDoc_STRVAR(bufferpool_doc,
"BufferPool(buffer_size, *, capacity=None, prealloc=0, zero=False, align=64)\n"
"--\n\n"
"A pool of fixed-size buffers (kpool.Block) carved from big chunks and\n"
"reused instead of freed.\n\n"
"capacity bounds the buffers in use at once (None: unbounded); prealloc\n"
"carves that many buffers up front; zero=True zeroes every acquired buffer;\n"
"every buffer's address is a multiple of align (a power of two).\n"
"Use acquire()/release() or `with pool.acquire() as buf:`; the pool is a\n"
"context manager that closes it.");

static PyType_Slot bufferpool_slots[] = {
    {Py_tp_doc, (void *)bufferpool_doc},
    {Py_tp_new, (void *)bufferpool_new},
    {Py_tp_dealloc, (void *)bufferpool_dealloc},
    {Py_tp_repr, (void *)bufferpool_repr},
    {Py_tp_methods, bufferpool_methods},
    {Py_tp_getset, bufferpool_getset},
    {0, NULL},
};

PyType_Spec kpy_bufferpool_spec = {
    .name = "kpool.BufferPool",
    .basicsize = sizeof(kpy_bufferpool),
    .itemsize = 0,
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = bufferpool_slots,
};
