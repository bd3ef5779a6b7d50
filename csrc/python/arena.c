/* arena.c: kpool.Arena, a region allocator over kp_arena.
 *
 * alloc() bumps a pointer through chunks and returns Blocks that hold a
 * reference to the Arena and the arena's generation; reset() frees them all
 * at once and bumps the generation, so every older Block then raises
 * ValueError on any use. reset() refuses (BufferError) while a view of any
 * of its Blocks is alive, so memory is never recycled under a memoryview.
 *
 * tracemalloc: each block is tracked when it is made and its address kept
 * in `traced` (only when tracemalloc took it); reset and dealloc untrack
 * them all. live counts this generation's Blocks that hold memory, for the
 * module's live counts.
 *
 * Locks: mu serialises every kp_arena_* call (kp_arena is not thread-safe
 * by itself) and guards generation, exports, live and traced; alloc, reset,
 * used, reserved and repr take it in every build. Where KPY_FT it is also
 * the lock of the arena's Blocks (kpy_block_lock): their dead check, their
 * views (exports) and every use of their memory run under it, so a reset,
 * which checks exports and frees the chunks under it, never frees memory in
 * use. It is taken without blocking first and only with the GIL released
 * when contended; no Python code runs while it is held.
 */
#include "kpy.h"

#include <errno.h>

#define ARENA_MAX_ALIGN ((size_t)1 << 30)
#define ARENA_MAX_CHUNK ((size_t)1 << 46)

static void arena_lock(kpy_arena *self) { kpy_lock(&self->mu); }
static void arena_unlock(kpy_arena *self) { kpy_unlock(&self->mu); }

/* Remember that p is traced, to untrack it at reset; if there is no memory
 * for that, untrack it now. REQUIRES: lock held. */
static void note_traced(kpy_arena *self, void *p) {
    if (self->ntraced == self->captraced) {
        size_t cap = self->captraced ? self->captraced * 2 : 64;
        uintptr_t *t = PyMem_RawRealloc(self->traced, cap * sizeof *t);
        if (!t) {
            kpy_untrack(p);
            return;
        }
        self->traced = t;
        self->captraced = cap;
    }
    self->traced[self->ntraced++] = (uintptr_t)p;
}

/* Untrack every block traced since the last reset. REQUIRES: lock held. */
static void untrack_all(kpy_arena *self) {
    for (size_t i = 0; i < self->ntraced; i++) kpy_untrack((const void *)self->traced[i]);
    self->ntraced = 0;
    if (self->captraced > 4096) {  /* a big generation's list does not stay */
        PyMem_RawFree(self->traced);
        self->traced = NULL;
        self->captraced = 0;
    }
}

/* kpy_arena_block_gone_locked, taking the lock where KPY_FT. */
static void block_gone(kpy_arena *self, uint64_t gen) {
    kpy_ft_lock(&self->mu);
    kpy_arena_block_gone_locked((PyObject *)self, gen);
    kpy_ft_unlock(&self->mu);
}

static const char *const alloc_kw[] = {"size", "align", NULL};

static PyObject *arena_alloc(kpy_arena *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *o[2] = {NULL, NULL};
    if (kpy_parse_args("alloc", args, nargs, kwnames, alloc_kw, 2, 1, o) < 0) return NULL;
    Py_ssize_t size;
    size_t align = 16;
    if (kpy_size_arg(o[0], "size", 1, &size) < 0) return NULL;
    if (o[1] && kpy_align_arg(o[1], "align", ARENA_MAX_ALIGN, &align) < 0) return NULL;
    arena_lock(self);
    errno = 0;
    void *p = kp_arena_alloc(self->arena, (size_t)size, align);
    int err = errno;
    uint64_t gen = self->generation;
    if (p) {
        self->live++;
        kpy_live_add(&self->state->live[KPY_ARENA], 1);
        if (kpy_track(p, (size_t)size) == 0) note_traced(self, p);
    }
    arena_unlock(self);
    if (!p) {
        if (err == EINVAL) PyErr_SetString(PyExc_ValueError, "invalid Arena.alloc arguments");
        else if ((size_t)size < self->chunk_size)   /* what failed was the chunk's mapping */
            PyErr_Format(PyExc_MemoryError, "Arena.alloc: cannot allocate %zd bytes (a new chunk of %zu bytes)",
                         size, (size_t)self->chunk_size);
        else kpy_no_memory("Arena.alloc", (size_t)size);
        return NULL;
    }
    /* on failure the bytes stay in the arena until reset: nothing leaks */
    PyObject *b = kpy_block_new(self->state->Block_type, p, size, KPY_ARENA, (PyObject *)self, gen, NULL);
    if (!b) block_gone(self, gen);
    return b;
}

/* Reset: 0 on success, -1 with BufferError while a view is alive. */
static int do_reset(kpy_arena *self) {
    Py_ssize_t exports;
    arena_lock(self);  /* the Blocks' lock too: none is using its memory now */
    if ((exports = self->exports) == 0) {
        self->generation++;
        untrack_all(self);  /* before their memory can be handed out again */
        kpy_live_add(&self->state->live[KPY_ARENA], -self->live);
        self->live = 0;
        kp_arena_reset(self->arena);
    }
    arena_unlock(self);
    if (exports > 0) {
        PyErr_Format(PyExc_BufferError, "cannot reset an Arena while %zd view%s of its blocks %s alive", exports,
                     exports == 1 ? "" : "s", exports == 1 ? "is" : "are");
        return -1;
    }
    return 0;
}

static PyObject *arena_reset(kpy_arena *self, PyObject *unused) {
    if (do_reset(self) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *arena_enter(kpy_arena *self, PyObject *unused) { return Py_NewRef((PyObject *)self); }

static PyObject *arena_exit(kpy_arena *self, PyObject *args) {
    if (do_reset(self) < 0) return NULL;
    Py_RETURN_FALSE;
}

static PyObject *get_used(kpy_arena *self, void *c) {
    arena_lock(self);
    size_t n = kp_arena_used(self->arena);
    arena_unlock(self);
    return PyLong_FromSize_t(n);
}

static PyObject *get_reserved(kpy_arena *self, void *c) {
    arena_lock(self);
    size_t n = kp_arena_reserved(self->arena);
    arena_unlock(self);
    return PyLong_FromSize_t(n);
}

static PyObject *get_chunk_size(kpy_arena *self, void *c) { return PyLong_FromSize_t(self->chunk_size); }
static PyObject *get_generation(kpy_arena *self, void *c) {
    kpy_ft_lock(&self->mu);
    uint64_t g = self->generation;
    kpy_ft_unlock(&self->mu);
    return PyLong_FromUnsignedLongLong(g);
}

static PyObject *arena_repr(kpy_arena *self) {
    arena_lock(self);
    size_t used = kp_arena_used(self->arena), reserved = kp_arena_reserved(self->arena);
    arena_unlock(self);
    return PyUnicode_FromFormat("<kpool.Arena chunk_size=%zu, used=%zu, reserved=%zu>", self->chunk_size, used,
                                reserved);
}

static PyObject *arena_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"chunk_size", NULL};
    PyObject *o_chunk = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O:Arena", kwlist, &o_chunk)) return NULL;
    Py_ssize_t chunk = (Py_ssize_t)1 << 20;
    if (o_chunk && kpy_size_arg(o_chunk, "chunk_size", 0, &chunk) < 0) return NULL;
    if ((size_t)chunk > ARENA_MAX_CHUNK) {
        PyErr_Format(PyExc_ValueError, "chunk_size %zd is above the limit of %zu bytes", chunk, ARENA_MAX_CHUNK);
        return NULL;
    }
    kp_arena *a = kp_arena_create((size_t)chunk);
    if (!a) {
        if (errno == EINVAL) PyErr_SetString(PyExc_ValueError, "invalid chunk_size");
        else PyErr_Format(PyExc_MemoryError, "Arena(chunk_size=%zd): cannot allocate the arena's own record", chunk);
        return NULL;
    }
    kpy_arena *self = (kpy_arena *)type->tp_alloc(type, 0);
    if (!self) {
        kp_arena_destroy(a);
        return NULL;
    }
    self->arena = a;
    pthread_mutex_init(&self->mu, NULL);
    self->state = kpy_state_of_type(type);
    self->chunk_size = (size_t)chunk;
    return (PyObject *)self;
}

static void arena_dealloc(kpy_arena *self) {
    PyTypeObject *tp = Py_TYPE(self);
    /* every Block holds a reference to its arena, so none is alive here
     * (live == 0); their traces may be */
    untrack_all(self);
    PyMem_RawFree(self->traced);
    if (self->arena) {
        kp_arena_destroy(self->arena);
        pthread_mutex_destroy(&self->mu);
    }
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyMethodDef arena_methods[] = {
    {"alloc", (PyCFunction)(void (*)(void))arena_alloc, METH_FASTCALL | METH_KEYWORDS,
     "alloc($self, /, size, align=16)\n--\n\n"
     "Return a Block of size bytes bumped from the current chunk; align must be\n"
     "a power of two. The Block is valid until the next reset()."},
    {"reset", (PyCFunction)(void (*)(void))arena_reset, METH_NOARGS,
     "reset($self, /)\n--\n\nFree every block at once (the first chunk is kept for reuse). Earlier\n"
     "Blocks then raise ValueError on any use. BufferError while any of them is\n"
     "exported (a memoryview is alive)."},
    {"__enter__", (PyCFunction)(void (*)(void))arena_enter, METH_NOARGS, "Return the arena itself."},
    {"__exit__", (PyCFunction)(void (*)(void))arena_exit, METH_VARARGS, "Reset the arena."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef arena_getset[] = {
    {"used", (getter)get_used, NULL, "Bytes handed out since the last reset.", NULL},
    {"reserved", (getter)get_reserved, NULL, "Bytes of chunks the arena holds.", NULL},
    {"chunk_size", (getter)get_chunk_size, NULL, "The chunk size asked for at creation.", NULL},
    {"generation", (getter)get_generation, NULL, "How many times the arena was reset.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyDoc_STRVAR(arena_doc,
"Arena(chunk_size=1048576)\n"
"--\n\n"
"A region allocator: alloc() bumps a pointer through chunks of chunk_size\n"
"bytes (a larger request gets a chunk of its own); reset() frees everything\n"
"at once. A context manager that resets on exit. Safe to use from several\n"
"threads (it holds a lock).");

static PyType_Slot arena_slots[] = {
    {Py_tp_doc, (void *)arena_doc},
    {Py_tp_new, (void *)arena_new},
    {Py_tp_dealloc, (void *)arena_dealloc},
    {Py_tp_repr, (void *)arena_repr},
    {Py_tp_methods, arena_methods},
    {Py_tp_getset, arena_getset},
    {0, NULL},
};

PyType_Spec kpy_arena_spec = {
    .name = "kpool.Arena",
    .basicsize = sizeof(kpy_arena),
    .itemsize = 0,
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = arena_slots,
};
