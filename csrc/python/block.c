/* block.c: kpool.Block, a writable buffer of exactly `size` bytes.
 *
 * A Block is made by kpool.malloc (kind heap), BufferPool.acquire (kind
 * pool) or Arena.alloc (kind arena) and never from Python directly. It
 * exposes its memory through the buffer protocol (memoryview, numpy,
 * readinto, recv_into) and gives it back on release(), on __exit__, or when
 * it is collected: heap blocks with kp_free_sized, pool blocks to their
 * BufferPool, arena blocks to nobody (the arena frees them all at reset).
 *
 * Invariants: exports == number of live Py_buffer views; release refuses
 * (BufferError) while exports > 0, so memory is never freed under a view;
 * released == 1 implies the memory is not ours. An arena Block whose
 * generation differs from its arena's is dead (the arena was reset) and
 * behaves as released.
 */
#include "kpy.h"

#include <stddef.h>

/* 1 if b's memory may no longer be used (released, or its arena was reset). */
static int block_dead(kpy_block *b) {
    if (b->released) return 1;
    if (b->kind == KPY_ARENA && !kpy_arena_current(b->owner, b->generation)) return 1;
    return 0;
}

/* Raise ValueError for use of a dead block; returns -1 for convenience. */
static int block_dead_error(kpy_block *b) {
    PyErr_SetString(PyExc_ValueError, b->released ? "operation on a released Block"
                                                  : "operation on a Block of an Arena that was reset");
    return -1;
}

PyObject *kpy_block_new(PyTypeObject *tp, char *ptr, Py_ssize_t size, int kind, PyObject *owner, uint64_t generation) {
    kpy_block *b = (kpy_block *)tp->tp_alloc(tp, 0);
    if (!b) return NULL;
    b->ptr = ptr;
    b->size = size;
    b->exports = 0;
    b->kind = kind;
    b->released = 0;
    b->generation = generation;
    Py_XINCREF(owner);
    b->owner = owner;
    return (PyObject *)b;
}

/* Give the memory back to where it came from. REQUIRES: not released, no exports. */
static void block_free_memory(kpy_block *b) {
    switch (b->kind) {
    case KPY_HEAP:
        kp_free_sized(b->ptr, (size_t)b->size);
        break;
    case KPY_POOL:
        kpy_bufferpool_put((kpy_bufferpool *)b->owner, b->ptr);
        break;
    default:  /* arena: freed all at once by the arena */
        break;
    }
    b->released = 1;
    b->ptr = NULL;
}

int kpy_block_release(kpy_block *b) {
    if (b->released) return 0;
    if (b->exports > 0) {
        PyErr_Format(PyExc_BufferError, "cannot release a Block while %zd view%s of it %s alive (release the memoryview first)",
                     b->exports, b->exports == 1 ? "" : "s", b->exports == 1 ? "is" : "are");
        return -1;
    }
    if (b->kind == KPY_ARENA && !kpy_arena_current(b->owner, b->generation)) {
        b->released = 1;
        b->ptr = NULL;
        return 0;
    }
    block_free_memory(b);
    return 0;
}

static void block_dealloc(kpy_block *b) {
    PyTypeObject *tp = Py_TYPE(b);
    /* exports > 0 cannot happen here: every view holds a reference to b */
    if (!b->released && b->exports == 0) {
        if (b->kind == KPY_ARENA && !kpy_arena_current(b->owner, b->generation)) b->released = 1;
        else block_free_memory(b);
    }
    Py_CLEAR(b->owner);
    tp->tp_free((PyObject *)b);
    Py_DECREF(tp);
}

/* ---- buffer protocol ------------------------------------------------------ */

static int block_getbuffer(kpy_block *b, Py_buffer *view, int flags) {
    if (block_dead(b)) {
        view->obj = NULL;
        return block_dead_error(b);
    }
    if (PyBuffer_FillInfo(view, (PyObject *)b, b->ptr, b->size, 0, flags) < 0) return -1;
    b->exports++;
    if (b->kind == KPY_ARENA) kpy_arena_export(b->owner, +1);
    return 0;
}

static void block_releasebuffer(kpy_block *b, Py_buffer *view) {
    (void)view;
    b->exports--;
    if (b->kind == KPY_ARENA) kpy_arena_export(b->owner, -1);
}

/* ---- methods and attributes ----------------------------------------------- */

static PyObject *block_release_meth(kpy_block *b, PyObject *unused) {
    if (kpy_block_release(b) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *block_enter(kpy_block *b, PyObject *unused) {
    if (block_dead(b)) return block_dead_error(b), NULL;
    Py_INCREF(b);
    return (PyObject *)b;
}

static PyObject *block_exit(kpy_block *b, PyObject *args) {
    if (kpy_block_release(b) < 0) return NULL;
    Py_RETURN_FALSE;
}

static PyObject *block_get_size(kpy_block *b, void *closure) {
    if (block_dead(b)) return block_dead_error(b), NULL;
    return PyLong_FromSsize_t(b->size);
}

static PyObject *block_get_address(kpy_block *b, void *closure) {
    if (block_dead(b)) return block_dead_error(b), NULL;
    return PyLong_FromVoidPtr(b->ptr);
}

static PyObject *block_get_usable_size(kpy_block *b, void *closure) {
    if (block_dead(b)) return block_dead_error(b), NULL;
    size_t n;
    switch (b->kind) {
    case KPY_HEAP: n = kp_usable_size(b->ptr); break;
    case KPY_POOL: n = ((kpy_bufferpool *)b->owner)->block_size; break;
    default: n = (size_t)b->size; break;
    }
    return PyLong_FromSize_t(n);
}

static PyObject *block_get_released(kpy_block *b, void *closure) { return PyBool_FromLong(block_dead(b)); }

static PyObject *block_get_kind(kpy_block *b, void *closure) {
    static const char *const names[] = {"heap", "pool", "arena"};
    return PyUnicode_FromString(names[b->kind]);
}

static Py_ssize_t block_len(kpy_block *b) {
    if (block_dead(b)) return block_dead_error(b);
    return b->size;
}

static PyObject *block_repr(kpy_block *b) {
    static const char *const names[] = {"heap", "pool", "arena"};
    if (block_dead(b)) return PyUnicode_FromFormat("<kpool.Block %s, released>", names[b->kind]);
    return PyUnicode_FromFormat("<kpool.Block %s, size=%zd, address=%p>", names[b->kind], b->size, (void *)b->ptr);
}

static PyMethodDef block_methods[] = {
    {"release", (PyCFunction)(void (*)(void))block_release_meth, METH_NOARGS,
     "release($self, /)\n--\n\nGive the memory back (to the heap, the BufferPool, or nothing for an\n"
     "arena block). Idempotent. Raises BufferError, and frees nothing, while a\n"
     "memoryview or other export of the block is alive."},
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
"constructible directly. Supports the buffer protocol (memoryview,\n"
"numpy.frombuffer, file.readinto, socket.recv_into), release() and the\n"
"context-manager protocol (released on exit). A Block that is garbage\n"
"collected is released. Any use after release raises ValueError.");

static PyType_Slot block_slots[] = {
    {Py_tp_doc, (void *)block_doc},
    {Py_tp_dealloc, (void *)block_dealloc},
    {Py_tp_repr, (void *)block_repr},
    {Py_tp_methods, block_methods},
    {Py_tp_getset, block_getset},
    {Py_sq_length, (void *)block_len},
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
