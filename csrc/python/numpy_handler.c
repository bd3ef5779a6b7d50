/* numpy_handler.c: the extension module kpool._numpy, numpy's data memory
 * on kpool (NEP 49).
 *
 * A numpy array's data buffer comes from the PyDataMem_Handler that is
 * current when the array is made (a context variable of numpy's); the array
 * keeps a reference to that handler's capsule and frees through it, so an
 * array made under kpool's handler goes back to kpool wherever and whenever
 * it dies. The handler here is "kpool": malloc, calloc and realloc are
 * kp_malloc, kp_calloc and kp_realloc, free is kp_free_sized with the size
 * numpy passes (the array's byte size), so kpool's bytes_requested stays
 * exact. kp_free_sized takes the block's size class from kpool's own map,
 * so a size numpy got wrong would only make that figure inexact, never harm
 * the heap.
 *
 * Functions: handler() (the capsule, one per module), get_handler() and
 * set_handler(capsule or None) over numpy's PyDataMem_GetHandler and
 * PyDataMem_SetHandler (numpy has no Python-level setter); kpool/_numpy_api.py
 * builds kpool.numpy_handler() and kpool.use_for_numpy() on them.
 *
 * Its own module, so that `import kpool` never needs numpy: importing
 * kpool._numpy imports numpy (import_array in the exec slot) and fails with
 * ImportError without it. Built against numpy >= 2 with NPY_TARGET_VERSION
 * 1.22, the first version with handlers: numpy documents such a build as
 * working with every numpy from the target version on, 1.x and 2.x.
 *
 * Threads: numpy may call the allocator functions from any thread, with or
 * without the GIL; they call only kpool's thread-safe kp_* functions. The
 * module state (the capsule) is written once by the exec slot, so the
 * module is declared free-threading safe.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define NPY_NO_DEPRECATED_API NPY_1_22_API_VERSION
#define NPY_TARGET_VERSION NPY_1_22_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL kpool_numpy_ARRAY_API
#include <numpy/arrayobject.h>

#include "kpool.h"

#define KPN_CAPSULE_NAME "mem_handler"  /* the name numpy checks */

static void *kpn_malloc(void *ctx, size_t size) {
    (void)ctx;
    return kp_malloc(size);
}

static void *kpn_calloc(void *ctx, size_t nelem, size_t elsize) {
    (void)ctx;
    return kp_calloc(nelem, elsize);
}

static void *kpn_realloc(void *ctx, void *ptr, size_t new_size) {
    (void)ctx;
    return kp_realloc(ptr, new_size);
}

static void kpn_free(void *ctx, void *ptr, size_t size) {
    (void)ctx;
    kp_free_sized(ptr, size);
}

/* numpy reads it through the capsule and never writes it */
static PyDataMem_Handler kpn_handler = {
    "kpool",
    1,
    {NULL, kpn_malloc, kpn_calloc, kpn_realloc, kpn_free},
};

typedef struct {
    PyObject *capsule;  /* the "mem_handler" capsule of kpn_handler */
} kpn_state;

static kpn_state *kpn_state_of(PyObject *m) { return (kpn_state *)PyModule_GetState(m); }

static PyObject *kpn_get_capsule(PyObject *module, PyObject *unused) {
    (void)unused;
    kpn_state *st = kpn_state_of(module);
    Py_INCREF(st->capsule);
    return st->capsule;
}

static PyObject *kpn_get_handler(PyObject *module, PyObject *unused) {
    (void)module;
    (void)unused;
    return PyDataMem_GetHandler();
}

static PyObject *kpn_set_handler(PyObject *module, PyObject *arg) {
    (void)module;
    if (arg == Py_None) return PyDataMem_SetHandler(NULL);  /* numpy's default handler */
    if (!PyCapsule_IsValid(arg, KPN_CAPSULE_NAME)) {
        PyErr_Format(PyExc_TypeError, "set_handler expects a 'mem_handler' capsule or None, not %.100s",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    return PyDataMem_SetHandler(arg);
}

static PyMethodDef kpn_methods[] = {
    {"handler", (PyCFunction)(void (*)(void))kpn_get_capsule, METH_NOARGS,
     "handler($module, /)\n--\n\nkpool's PyDataMem_Handler (named \"kpool\") in a PyCapsule named \"mem_handler\".\n"
     "Always the same object."},
    {"get_handler", (PyCFunction)(void (*)(void))kpn_get_handler, METH_NOARGS,
     "get_handler($module, /)\n--\n\nnumpy's current handler capsule in this context (PyDataMem_GetHandler)."},
    {"set_handler", (PyCFunction)(void (*)(void))kpn_set_handler, METH_O,
     "set_handler($module, handler, /)\n--\n\nMake handler (a \"mem_handler\" capsule, or None for numpy's default)\n"
     "numpy's handler in the current context (PyDataMem_SetHandler); returns\n"
     "the previous one."},
    {NULL, NULL, 0, NULL},
};

static int kpn_exec(PyObject *m) {
    if (_import_array() < 0) return -1;  /* ImportError without numpy (or one older than 1.22) */
    kpn_state *st = kpn_state_of(m);
    st->capsule = PyCapsule_New(&kpn_handler, KPN_CAPSULE_NAME, NULL);
    if (!st->capsule) return -1;
    if (PyModule_AddStringConstant(m, "HANDLER_NAME", kpn_handler.name) < 0) return -1;
    return 0;
}

static int kpn_traverse(PyObject *m, visitproc visit, void *arg) {
    kpn_state *st = kpn_state_of(m);
    if (st) Py_VISIT(st->capsule);
    return 0;
}

static int kpn_clear(PyObject *m) {
    kpn_state *st = kpn_state_of(m);
    if (st) Py_CLEAR(st->capsule);
    return 0;
}

static void kpn_free_module(void *m) { kpn_clear((PyObject *)m); }

static PyModuleDef_Slot kpn_slots[] = {
    {Py_mod_exec, (void *)kpn_exec},
#ifdef Py_mod_gil
    {Py_mod_gil, Py_MOD_GIL_NOT_USED},
#endif
    {0, NULL},
};

static PyModuleDef kpn_moduledef = {
    PyModuleDef_HEAD_INIT,
    .m_name = "kpool._numpy",
    .m_doc = "kpool._numpy: numpy's data memory on kpool (NEP 49). Use kpool.numpy_handler() and kpool.use_for_numpy().",
    .m_size = sizeof(kpn_state),
    .m_methods = kpn_methods,
    .m_slots = kpn_slots,
    .m_traverse = kpn_traverse,
    .m_clear = kpn_clear,
    .m_free = kpn_free_module,
};

PyMODINIT_FUNC PyInit__numpy(void) { return PyModuleDef_Init(&kpn_moduledef); }
