/* block.c: kpool.Block, a writable buffer of exactly `size` bytes.
 *
 * A Block is made by kpool.malloc (kind heap), BufferPool.acquire (kind
 * pool) or Arena.alloc (kind arena) and never from Python directly. It
 * exposes its memory through the buffer protocol (memoryview, numpy,
 * readinto, recv_into) and through indexing, like a bytearray whose size
 * never changes by assignment (heap blocks change it with resize(), through
 * kp_realloc), and gives it back on release(), on __exit__, or when it is
 * collected: heap blocks with kp_free_sized, pool blocks to their
 * BufferPool, arena blocks to nobody (the arena frees them all at reset). A
 * dead Block's object memory may be kept as a spare wrapper (kpy.h).
 *
 * Invariants: exports == number of live Py_buffer views; release refuses
 * (BufferError) while exports > 0, so memory is never freed under a view;
 * released == 1 implies the memory is not ours. An arena Block whose
 * generation differs from its arena's is dead (the arena was reset) and
 * behaves as released. Every operation checks for a dead block after the
 * conversions of its arguments (__index__, a value's buffer), which run
 * Python code that may release it.
 *
 * Locking (kpy.h, "Threads and the GIL"): where KPY_FT every read or change
 * of released, exports, ptr, size and traced, and every use of the memory
 * here, happens under kpy_block_lock (the Block's own mutex, or its arena's
 * for an arena Block); each operation copies out what it needs, unlocks,
 * and then makes its result or raises. In a GIL build the lock calls
 * compile to nothing.
 */
#include "kpy.h"

#include <stddef.h>
#include <string.h>

#ifdef Py_T_PYSSIZET  /* 3.12+ */
#define KPY_T_PYSSIZET Py_T_PYSSIZET
#define KPY_READONLY Py_READONLY
#else
#include <structmember.h>
#define KPY_T_PYSSIZET T_PYSSIZET
#define KPY_READONLY READONLY
#endif

/* Why b's memory may no longer be used: ALIVE, RELEASED, or RESET (its
 * arena was reset). REQUIRES: b's lock (kpy_block_lock). */
enum { ALIVE = 0, RELEASED = 1, RESET = 2 };
static inline int block_state(kpy_block *b) {
    if (b->released) return RELEASED;
    if (b->kind == KPY_ARENA && !kpy_arena_current(b->owner, b->generation)) return RESET;
    return ALIVE;
}

/* Raise ValueError for use of a dead block (why: RELEASED or RESET);
 * returns -1 for convenience. */
static int dead_error(int why) {
    PyErr_SetString(PyExc_ValueError, why == RELEASED ? "operation on a released Block"
                                                      : "operation on a Block of an Arena that was reset");
    return -1;
}

/* b's state, and its ptr and size, read under its lock. */
static inline int block_peek(kpy_block *b, char **ptr, Py_ssize_t *size) {
    kpy_block_lock(b);
    int why = block_state(b);
    *ptr = b->ptr;
    *size = b->size;
    kpy_block_unlock(b);
    return why;
}

/* BufferError for releasing or resizing a Block with n views alive. Returns -1. */
static int exported_error(const char *what, Py_ssize_t n) {
    PyErr_Format(PyExc_BufferError, "cannot %s a Block while %zd view%s of it %s alive (release the memoryview first)",
                 what, n, n == 1 ? "" : "s", n == 1 ? "is" : "are");
    return -1;
}

/* Leave the memory of the dead wrapper b in *spare; 0 if the slot was
 * taken (then the caller frees b). */
static inline int spare_put(kpy_spare *spare, kpy_block *b) {
    kpy_block *expected = NULL;
    if (atomic_load_explicit(spare, memory_order_relaxed)) return 0;
    return atomic_compare_exchange_strong_explicit(spare, &expected, b, memory_order_release, memory_order_relaxed);
}

void kpy_spare_clear(kpy_spare *spare) {
    kpy_block *b = atomic_exchange_explicit(spare, NULL, memory_order_acquire);
    if (b) PyObject_Free(b);  /* the Block type's tp_free: it is not a GC type */
}

kpy_block *kpy_block_alloc(PyTypeObject *tp) { return (kpy_block *)tp->tp_alloc(tp, 0); }

/* Under b's lock: mark b released. Returns 1 if the caller must give the
 * memory (*ptr, *size, *traced) back, 0 if there is nothing to give back
 * (released already, or its arena was reset: an arena Block's memory stays
 * the arena's), -1 while views are alive (*exports of them; b unchanged).
 * An arena Block leaves the arena's live count here, under the arena's lock. */
static inline int block_take(kpy_block *b, char **ptr, Py_ssize_t *size, int *traced, Py_ssize_t *exports) {
    int r;
    kpy_block_lock(b);
    if (b->released) {
        r = 0;
    } else if (b->exports > 0) {
        *exports = b->exports;
        r = -1;
    } else {
        if (b->kind == KPY_ARENA) {
            kpy_arena_block_gone_locked(b->owner, b->generation);
            r = 0;
        } else {
            *ptr = b->ptr;
            *size = b->size;
            *traced = b->traced;
            r = 1;
        }
        b->released = 1;
        b->ptr = NULL;
    }
    kpy_block_unlock(b);
    return r;
}

/* Give memory taken by block_take back to where it came from (no lock held). */
static inline void block_give_back(kpy_block *b, char *ptr, Py_ssize_t size, int traced) {
    if (b->kind == KPY_HEAP) {
        if (traced) kpy_untrack(ptr);
        kp_free_sized(ptr, (size_t)size);
        kpy_live_add(&((kpy_state *)PyType_GetModuleState(Py_TYPE(b)))->live[KPY_HEAP], -1);
    } else {
        kpy_bufferpool_put((kpy_bufferpool *)b->owner, ptr, traced);
    }
}

int kpy_block_release(kpy_block *b) {
    char *ptr = NULL;
    Py_ssize_t size = 0, exports = 0;
    int traced = 0;
    int r = block_take(b, &ptr, &size, &traced, &exports);
    if (r < 0) return exported_error("release", exports);
    if (r > 0) block_give_back(b, ptr, size, traced);
    return 0;
}

static void block_dealloc(kpy_block *b) {
    PyTypeObject *tp = Py_TYPE(b);
    /* weak references die first: their callbacks may run Python code, which
     * sees a Block that is going away (released or not) */
    if (b->weakreflist) PyObject_ClearWeakRefs((PyObject *)b);
    /* exports > 0 cannot happen here: every view holds a reference to b */
    char *ptr = NULL;
    Py_ssize_t size = 0, exports = 0;
    int traced = 0;
    if (block_take(b, &ptr, &size, &traced, &exports) > 0) block_give_back(b, ptr, size, traced);
#if KPY_FT
    pthread_mutex_destroy(&b->mu);
#endif
    kpy_spare *spare = NULL;
    if (b->kind == KPY_POOL) spare = &((kpy_bufferpool *)b->owner)->spare;
    else if (b->kind == KPY_HEAP) {
        kpy_state *st = PyType_GetModuleState(tp);  /* alive: tp holds its module */
        if (st) spare = &st->heap_spare;
    }
    PyObject *owner = b->owner;
    b->owner = NULL;
    /* the memory goes to the spare slot before the owner reference is
     * dropped: a pool that dies of it frees its slot, this memory included */
    if (!spare || !spare_put(spare, b)) tp->tp_free((PyObject *)b);
    Py_XDECREF(owner);
    Py_DECREF(tp);
}

/* ---- buffer protocol ------------------------------------------------------ */

static int block_getbuffer(kpy_block *b, Py_buffer *view, int flags) {
    kpy_block_lock(b);
    int why = block_state(b);
    if (!why) {
        b->exports++;
        if (b->kind == KPY_ARENA) kpy_arena_export(b->owner, +1);
    }
    char *ptr = b->ptr;
    Py_ssize_t size = b->size;
    kpy_block_unlock(b);
    if (why) {
        view->obj = NULL;
        return dead_error(why);
    }
    /* exported: ptr stays b's until the view is released */
    if (PyBuffer_FillInfo(view, (PyObject *)b, ptr, size, 0, flags) < 0) {
        kpy_block_lock(b);
        b->exports--;
        if (b->kind == KPY_ARENA) kpy_arena_export(b->owner, -1);
        kpy_block_unlock(b);
        return -1;
    }
    return 0;
}

static void block_releasebuffer(kpy_block *b, Py_buffer *view) {
    (void)view;
    kpy_block_lock(b);
    b->exports--;
    if (b->kind == KPY_ARENA) kpy_arena_export(b->owner, -1);
    kpy_block_unlock(b);
}

/* ---- indexing: b[i], b[i:j], b[i:j:k], read and write --------------------- */

/* The index key as a Py_ssize_t (may run __index__). 0 or -1 with an error. */
static int index_of(PyObject *key, Py_ssize_t *out) {
    Py_ssize_t i = PyNumber_AsSsize_t(key, PyExc_IndexError);
    if (i == -1 && PyErr_Occurred()) return -1;
    *out = i;
    return 0;
}

static PyObject *wrong_key(PyObject *key) {
    PyErr_Format(PyExc_TypeError, "Block indices must be integers or slices, not %.100s", Py_TYPE(key)->tp_name);
    return NULL;
}

static PyObject *index_error(void) {
    PyErr_SetString(PyExc_IndexError, "Block index out of range");
    return NULL;
}

/* b[i] read under b's lock: the byte, or -1 if i is out of range. A
 * negative i counts from the end if wrap (else it is out of range: the
 * sequence protocol made i absolute already). *why: b's state (the byte
 * only when ALIVE). */
static inline int byte_get(kpy_block *b, Py_ssize_t i, int wrap, int *why) {
    int v = -1;
    kpy_block_lock(b);
    if (!(*why = block_state(b))) {
        if (i < 0 && wrap) i += b->size;
        if (i >= 0 && i < b->size) v = (unsigned char)b->ptr[i];
    }
    kpy_block_unlock(b);
    return v;
}

/* b[i] = x under b's lock (i < 0 counts from the end): 0, or -1 if i is out
 * of range. *why: b's state (written only when ALIVE). */
static inline int byte_set(kpy_block *b, Py_ssize_t i, int x, int *why) {
    int r = -1;
    kpy_block_lock(b);
    if (!(*why = block_state(b))) {
        if (i < 0) i += b->size;
        if (i >= 0 && i < b->size) {
            b->ptr[i] = (char)x;
            r = 0;
        }
    }
    kpy_block_unlock(b);
    return r;
}

static PyObject *block_item(kpy_block *b, Py_ssize_t i) {
    int why;
    int v = byte_get(b, i, 0, &why);
    if (why) return dead_error(why), NULL;
    if (v < 0) return index_error();
    return PyLong_FromLong(v);
}

/* b[start:stop:step] as bytes (new reference) or NULL. The bytes object is
 * made first, for the size read under the lock, and filled under it; if a
 * resize changed the size in between, again. */
static PyObject *slice_get(kpy_block *b, Py_ssize_t start, Py_ssize_t stop, Py_ssize_t step) {
    for (;;) {
        char *ptr;
        Py_ssize_t size;
        int why = block_peek(b, &ptr, &size);
        if (why) return dead_error(why), NULL;
        Py_ssize_t s = start, e = stop;
        Py_ssize_t n = PySlice_AdjustIndices(size, &s, &e, step);
#if !KPY_FT
        /* with the GIL nothing changes b meanwhile (making bytes runs no Python code) */
        if (step == 1) return PyBytes_FromStringAndSize(ptr + s, n);
#endif
        PyObject *r = PyBytes_FromStringAndSize(NULL, n);
        if (!r) return NULL;
        char *d = PyBytes_AS_STRING(r);
        kpy_block_lock(b);
        why = block_state(b);
        int same = !why && b->size == size;
        if (same) {
            if (step == 1) memcpy(d, b->ptr + s, (size_t)n);
            else
                for (Py_ssize_t k = 0, j = s; k < n; k++, j += step) d[k] = b->ptr[j];
        }
        kpy_block_unlock(b);
        if (same) return r;
        Py_DECREF(r);
        if (why) return dead_error(why), NULL;
    }
}

static PyObject *block_subscript(kpy_block *b, PyObject *key) {
    if (PyIndex_Check(key)) {
        Py_ssize_t i;
        if (index_of(key, &i) < 0) return NULL;
        /* checked after the conversion: __index__ may have released b */
        int why;
        int v = byte_get(b, i, 1, &why);
        if (why) return dead_error(why), NULL;
        if (v < 0) return index_error();
        return PyLong_FromLong(v);
    }
    if (!PySlice_Check(key)) return wrong_key(key);
    Py_ssize_t start, stop, step;
    if (PySlice_Unpack(key, &start, &stop, &step) < 0) return NULL;
    return slice_get(b, start, stop, step);
}

/* A byte value for b[i] = v: an int in 0..255. -1 with TypeError/ValueError. */
static int byte_of(PyObject *v) {
    if (!PyIndex_Check(v)) {
        PyErr_Format(PyExc_TypeError, "a Block item must be an int in range(0, 256), not %.100s", Py_TYPE(v)->tp_name);
        return -1;
    }
    Py_ssize_t x = PyNumber_AsSsize_t(v, NULL);
    if (x == -1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return -1;
        PyErr_Clear();
        x = -1;
    }
    if (x < 0 || x > 255) {
        PyErr_SetString(PyExc_ValueError, "byte must be in range(0, 256)");
        return -1;
    }
    return (int)x;
}

/* The bytes of a value for a slice assignment: buf and len, held alive by
 * view (while view_held) or copy until slice_value_release. */
typedef struct {
    Py_buffer view;
    int view_held;
    PyObject *copy;  /* bytes or bytearray holding a contiguous copy */
    const char *buf;
    Py_ssize_t len;
} slice_value;

static void slice_value_release(slice_value *sv) {
    if (sv->view_held) PyBuffer_Release(&sv->view);
    sv->view_held = 0;
    Py_CLEAR(sv->copy);
}

/* Fill sv from v: objects with the buffer protocol (any shape: their bytes
 * in C order) and iterables of ints in 0..255, as bytearray takes; not str
 * or int. 0, or -1 with TypeError/ValueError/BufferError. */
static int slice_value_get(PyObject *v, slice_value *sv) {
    memset(sv, 0, sizeof *sv);
    if (PyObject_CheckBuffer(v)) {
        if (PyObject_GetBuffer(v, &sv->view, PyBUF_FULL_RO) < 0) return -1;
        sv->view_held = 1;
        if (PyBuffer_IsContiguous(&sv->view, 'C')) {
            sv->buf = sv->view.buf;
            sv->len = sv->view.len;
            return 0;
        }
        sv->copy = PyBytes_FromStringAndSize(NULL, sv->view.len);
        if (!sv->copy || PyBuffer_ToContiguous(PyBytes_AS_STRING(sv->copy), &sv->view, sv->view.len, 'C') < 0) {
            slice_value_release(sv);
            return -1;
        }
        PyBuffer_Release(&sv->view);
        sv->view_held = 0;
        sv->buf = PyBytes_AS_STRING(sv->copy);
        sv->len = PyBytes_GET_SIZE(sv->copy);
        return 0;
    }
    if (PyUnicode_Check(v) || PyIndex_Check(v)) {
        PyErr_Format(PyExc_TypeError,
                     "can assign only bytes, buffers, or iterables of ints in range(0, 256) to a Block slice, not %.100s",
                     Py_TYPE(v)->tp_name);
        return -1;
    }
    sv->copy = PyByteArray_FromObject(v);  /* iterables of ints, range-checked */
    if (!sv->copy) return -1;
    sv->buf = PyByteArray_AS_STRING(sv->copy);
    sv->len = PyByteArray_GET_SIZE(sv->copy);
    return 0;
}

/* The bytes of sv into b[start:stop:step] under b's lock. 0; -1 with *n set
 * when sv's length differs from the slice's (*n); -2 out of memory. *why:
 * b's state (written only when ALIVE). */
static int slice_set(kpy_block *b, Py_ssize_t start, Py_ssize_t stop, Py_ssize_t step, const slice_value *sv,
                     Py_ssize_t *n, int *why) {
    int r = 0;
    kpy_block_lock(b);
    if ((*why = block_state(b))) goto out;
    *n = PySlice_AdjustIndices(b->size, &start, &stop, step);
    if (sv->len != *n) {
        r = -1;
    } else if (step == 1) {
        memmove(b->ptr + start, sv->buf, (size_t)*n);  /* the value may be a view of b itself */
    } else if (*n > 0) {
        const char *src = sv->buf;
        char *tmp = NULL;
        if (src < b->ptr + b->size && src + *n > b->ptr) {  /* overlaps b: copy it first */
            if (!(tmp = PyMem_RawMalloc((size_t)*n))) {  /* callable without the GIL */
                r = -2;
                goto out;
            }
            memcpy(tmp, src, (size_t)*n);
            src = tmp;
        }
        for (Py_ssize_t k = 0, j = start; k < *n; k++, j += step) b->ptr[j] = src[k];
        PyMem_RawFree(tmp);
    }
out:
    kpy_block_unlock(b);
    return r;
}

static int block_ass_subscript(kpy_block *b, PyObject *key, PyObject *v) {
    if (!v) {
        PyErr_SetString(PyExc_TypeError, "cannot delete from a Block: its size is fixed (see resize())");
        return -1;
    }
    int why;
    if (PyIndex_Check(key)) {
        Py_ssize_t i;
        if (index_of(key, &i) < 0) return -1;
        int x = byte_of(v);
        if (x < 0) return -1;
        /* checked after the conversions, which may have released b */
        int r = byte_set(b, i, x, &why);
        if (why) return dead_error(why);
        if (r < 0) return index_error(), -1;
        return 0;
    }
    if (!PySlice_Check(key)) return wrong_key(key), -1;
    Py_ssize_t start, stop, step;
    if (PySlice_Unpack(key, &start, &stop, &step) < 0) return -1;
    slice_value sv;
    if (slice_value_get(v, &sv) < 0) return -1;
    /* everything that may run Python code is done: check b now */
    Py_ssize_t n = 0;
    int r = slice_set(b, start, stop, step, &sv, &n, &why);
    if (why) {
        r = dead_error(why);
    } else if (r == -1) {
        PyErr_Format(PyExc_ValueError,
                     "a Block cannot change size by slice assignment: the slice has %zd byte%s, the value %zd "
                     "(use resize() on a heap Block)", n, n == 1 ? "" : "s", sv.len);
    } else if (r == -2) {
        kpy_no_memory("Block slice assignment", (size_t)n);
        r = -1;
    }
    slice_value_release(&sv);
    return r;
}

/* ---- methods and attributes ----------------------------------------------- */

static PyObject *block_release_meth(kpy_block *b, PyObject *unused) {
    if (kpy_block_release(b) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *block_enter(kpy_block *b, PyObject *unused) {
    char *ptr;
    Py_ssize_t size;
    int why = block_peek(b, &ptr, &size);
    if (why) return dead_error(why), NULL;
    Py_INCREF(b);
    return (PyObject *)b;
}

static PyObject *block_exit(kpy_block *b, PyObject *args) {
    if (kpy_block_release(b) < 0) return NULL;
    Py_RETURN_FALSE;
}

static const char *const kind_names[] = {"heap", "pool", "arena"};

static PyObject *block_resize(kpy_block *b, PyObject *arg) {
    Py_ssize_t n;
    if (kpy_size_arg(arg, "size", 1, &n) < 0) return NULL;
    /* checked after __index__, which may release b */
    enum { OK, DEAD, NOT_HEAP, EXPORTED, NO_MEMORY } err = OK;
    Py_ssize_t exports = 0;
    kpy_block_lock(b);
    int why = block_state(b);
    if (why) {
        err = DEAD;
    } else if (b->kind != KPY_HEAP) {
        err = NOT_HEAP;
    } else if (b->exports > 0) {
        err = EXPORTED;
        exports = b->exports;
    } else if (n != b->size) {
        /* tracemalloc's calls under the lock: the trace must go before
         * kp_realloc_sized may free the address, which another thread may then
         * take and trace (they run no Python code, take no kpool lock) */
        if (b->traced) kpy_untrack(b->ptr);
        char *p = kp_realloc_sized(b->ptr, (size_t)b->size, (size_t)n);   /* bytes_requested stays exact */
        if (!p) {
            b->traced = kpy_track(b->ptr, (size_t)b->size) == 0;
            err = NO_MEMORY;  /* the block is left as it was */
        } else {
            b->ptr = p;
            b->size = n;
            b->traced = kpy_track(p, (size_t)n) == 0;
        }
    }
    kpy_block_unlock(b);
    switch (err) {
    case OK: Py_RETURN_NONE;
    case DEAD: return dead_error(why), NULL;
    case NOT_HEAP:
        PyErr_Format(PyExc_TypeError,
                     "resize() works on heap Blocks (from kpool.malloc) only: this is %s, whose size is fixed",
                     b->kind == KPY_POOL ? "a BufferPool buffer" : "an Arena block");
        return NULL;
    case EXPORTED: return exported_error("resize", exports), NULL;
    default: return kpy_no_memory("Block.resize", (size_t)n);
    }
}

static PyObject *block_get_size(kpy_block *b, void *closure) {
    char *ptr;
    Py_ssize_t size;
    int why = block_peek(b, &ptr, &size);
    if (why) return dead_error(why), NULL;
    return PyLong_FromSsize_t(size);
}

static PyObject *block_get_address(kpy_block *b, void *closure) {
    char *ptr;
    Py_ssize_t size;
    int why = block_peek(b, &ptr, &size);
    if (why) return dead_error(why), NULL;
    return PyLong_FromVoidPtr(ptr);
}

static PyObject *block_get_usable_size(kpy_block *b, void *closure) {
    size_t n = 0;
    kpy_block_lock(b);
    int why = block_state(b);
    if (!why) {
        switch (b->kind) {
        case KPY_HEAP: n = kp_usable_size(b->ptr); break;  /* under the lock: a release may free ptr */
        case KPY_POOL: n = ((kpy_bufferpool *)b->owner)->block_size; break;
        default: n = (size_t)b->size; break;
        }
    }
    kpy_block_unlock(b);
    if (why) return dead_error(why), NULL;
    return PyLong_FromSize_t(n);
}

static PyObject *block_get_released(kpy_block *b, void *closure) {
    char *ptr;
    Py_ssize_t size;
    return PyBool_FromLong(block_peek(b, &ptr, &size) != ALIVE);
}

static PyObject *block_get_kind(kpy_block *b, void *closure) { return PyUnicode_FromString(kind_names[b->kind]); }

static Py_ssize_t block_len(kpy_block *b) {
    char *ptr;
    Py_ssize_t size;
    int why = block_peek(b, &ptr, &size);
    if (why) return dead_error(why);
    return size;
}

static PyObject *block_repr(kpy_block *b) {
    char *ptr;
    Py_ssize_t size;
    if (block_peek(b, &ptr, &size)) return PyUnicode_FromFormat("<kpool.Block %s, released>", kind_names[b->kind]);
    return PyUnicode_FromFormat("<kpool.Block %s, size=%zd, address=%p>", kind_names[b->kind], size, (void *)ptr);
}

static PyMethodDef block_methods[] = {
    {"release", (PyCFunction)(void (*)(void))block_release_meth, METH_NOARGS,
     "release($self, /)\n--\n\nGive the memory back (to the heap, the BufferPool, or nothing for an\n"
     "arena block). Idempotent. Raises BufferError, and frees nothing, while a\n"
     "memoryview or other export of the block is alive."},
    {"resize", (PyCFunction)(void (*)(void))block_resize, METH_O,
     "resize($self, size, /)\n--\n\nChange the size of a heap Block (from kpool.malloc) to size bytes, in\n"
     "place when kpool can (kp_realloc_sized), else by moving it (the address\n"
     "changes); kpool.stats()'s bytes_requested moves by the size change exactly.\n"
     "The first min(old, new) bytes are kept; bytes past the old size are not\n"
     "initialised. Raises BufferError while a memoryview or other export is\n"
     "alive, TypeError for a BufferPool buffer or an Arena block (their size is\n"
     "fixed), ValueError for a negative size or a released Block, OverflowError\n"
     "for a size of 2**63 or more (not a Py_ssize_t) and MemoryError (the Block\n"
     "unchanged) when out of memory or address space."},
    {"__enter__", (PyCFunction)(void (*)(void))block_enter, METH_NOARGS, "Return the block itself."},
    {"__exit__", (PyCFunction)(void (*)(void))block_exit, METH_VARARGS, "Release the block."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef block_getset[] = {
    {"size", (getter)block_get_size, NULL, "Bytes exposed through the buffer protocol (exactly as requested).", NULL},
    {"address", (getter)block_get_address, NULL, "The address of the first byte, as an int.", NULL},
    {"usable_size", (getter)block_get_usable_size, NULL,
     "Bytes actually reserved for this block (>= size): the size class, the pool's block size.", NULL},
    {"released", (getter)block_get_released, NULL,
     "True once the block was released (or its Arena was reset).", NULL},
    {"kind", (getter)block_get_kind, NULL, "Where the memory came from: 'heap', 'pool' or 'arena'.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyDoc_STRVAR(block_doc,
"A writable buffer of exactly `size` bytes of kpool memory.\n\n"
"Made by kpool.malloc(), BufferPool.acquire() and Arena.alloc(); not\n"
"constructible directly. Supports the buffer protocol (memoryview, bytes(b),\n"
"numpy.frombuffer, file.readinto, socket.recv_into), len(b), indexing like\n"
"a bytearray of fixed size (b[i] is an int, b[i:j] and b[i:j:k] are bytes;\n"
"b[i] = 65 and b[i:j] = b'...' of the same length write; a slice assignment\n"
"of another length raises ValueError, del b[...] TypeError), weak references, release() and\n"
"the context-manager protocol (released on exit). Heap Blocks can be\n"
"resize()d. A Block that is garbage collected is released. Any use after\n"
"release raises ValueError.");

/* Weak references through an inline list on every version:
 * Py_TPFLAGS_MANAGED_WEAKREF (3.12+) keeps the list in a pre-header that
 * assumes a GC header before the object, which would make every Block a GC
 * object (a bigger allocation, tracking on every acquire). */
static PyMemberDef block_members[] = {
    {"__weaklistoffset__", KPY_T_PYSSIZET, offsetof(kpy_block, weakreflist), KPY_READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot block_slots[] = {
    {Py_tp_doc, (void *)block_doc},
    {Py_tp_dealloc, (void *)block_dealloc},
    {Py_tp_repr, (void *)block_repr},
    {Py_tp_methods, block_methods},
    {Py_tp_getset, block_getset},
    {Py_tp_members, block_members},
    {Py_sq_length, (void *)block_len},
    {Py_sq_item, (void *)block_item},
    {Py_mp_length, (void *)block_len},
    {Py_mp_subscript, (void *)block_subscript},
    {Py_mp_ass_subscript, (void *)block_ass_subscript},
    {Py_bf_getbuffer, (void *)block_getbuffer},
    {Py_bf_releasebuffer, (void *)block_releasebuffer},
    {0, NULL},
};

PyType_Spec kpy_block_spec = {
    .name = "kpool.Block",
    .basicsize = sizeof(kpy_block),
    .itemsize = 0,
#ifdef Py_TPFLAGS_DISALLOW_INSTANTIATION
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
#else
    .flags = Py_TPFLAGS_DEFAULT,
#endif
    .slots = block_slots,
};
