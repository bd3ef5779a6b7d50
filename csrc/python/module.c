/* module.c: the module kpool._core (multi-phase init, module state).
 *
 * Defines the module functions (malloc, stats, stats_reset, trim,
 * thread_flush, stress, stress_cancel), the exceptions (Error, PoolExhausted,
 * CorruptionError) and the argument helpers shared by the type files.
 * The exec slot creates the heap types Block, BufferPool and Arena from
 * their PyType_Specs and keeps them, with the exceptions, in the module
 * state; m_traverse/m_clear/m_free manage those references.
 */
#include "kpy.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#ifdef KPOOL_HAVE_STRESS
#include "stress.h"
#endif

/* ---- module state ------------------------------------------------------------ */

/* The state of module m. Never NULL for our module. */
static kpy_state *state_of_module(PyObject *m) { return (kpy_state *)PyModule_GetState(m); }

kpy_state *kpy_state_of_type(PyTypeObject *tp) {
#if PY_VERSION_HEX >= 0x030B0000
    PyObject *m = PyType_GetModuleByDef(tp, &kpy_moduledef);
#else
    /* 3.9/3.10: our types are final (no Py_TPFLAGS_BASETYPE), so tp is the
     * very type the module created and PyType_GetModule finds its module. */
    PyObject *m = PyType_GetModule(tp);
#endif
    return state_of_module(m);
}

/* ---- argument helpers ---------------------------------------------------------- */

int kpy_parse_args(const char *fname, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                   const char *const *names, int npos, int nreq, PyObject **out) {
    int n = 0;
    while (names[n]) n++;
    for (int i = 0; i < n; i++) out[i] = NULL;
    if (nargs > npos) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %d positional argument%s (%zd given)", fname, npos,
                     npos == 1 ? "" : "s", nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) out[i] = args[i];
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, k);
        int found = -1;
        for (int i = 0; i < n; i++) {
            if (PyUnicode_CompareWithASCIIString(key, names[i]) == 0) {
                found = i;
                break;
            }
        }
        if (found < 0) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'", fname, key);
            return -1;
        }
        if (out[found]) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", fname, names[found]);
            return -1;
        }
        out[found] = args[nargs + k];
    }
    for (int i = 0; i < nreq; i++) {
        if (!out[i]) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s'", fname, names[i]);
            return -1;
        }
    }
    return 0;
}

int kpy_size_arg(PyObject *o, const char *name, int allow_zero, Py_ssize_t *out) {
    if (PyLong_CheckExact(o)) {  /* the common case, without a new reference */
        Py_ssize_t n = PyLong_AsSsize_t(o);
        if (n > 0 || (n == 0 && allow_zero)) {
            *out = n;
            return 0;
        }
        if (n == -1 && PyErr_Occurred()) PyErr_Clear();  /* the general path below says why */
    }
    if (PyFloat_Check(o) || !PyIndex_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, not %.100s", name, Py_TYPE(o)->tp_name);
        return -1;
    }
    PyObject *v = PyNumber_Index(o);
    if (!v) return -1;
    Py_ssize_t n = PyLong_AsSsize_t(v);
    if (n == -1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyObject *zero = PyLong_FromLong(0);
            int neg = zero ? PyObject_RichCompareBool(v, zero, Py_LT) : -1;
            Py_XDECREF(zero);
            if (neg == 1) {
                PyErr_Clear();
                PyErr_Format(PyExc_ValueError, "%s must not be negative", name);
            } else if (neg == 0) {
                PyErr_Clear();
                PyErr_Format(PyExc_OverflowError, "%s is too large", name);
            }
        }
        Py_DECREF(v);
        return -1;
    }
    Py_DECREF(v);
    if (n < 0) {
        PyErr_Format(PyExc_ValueError, "%s must not be negative", name);
        return -1;
    }
    if (n == 0 && !allow_zero) {
        PyErr_Format(PyExc_ValueError, "%s must be positive", name);
        return -1;
    }
    *out = n;
    return 0;
}

int kpy_align_arg(PyObject *o, const char *name, size_t max, size_t *out) {
    Py_ssize_t a;
    if (kpy_size_arg(o, name, 0, &a) < 0) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "%s is above the limit of %zu", name, max);
        }
        return -1;
    }
    if ((a & (a - 1)) != 0) {
        PyErr_Format(PyExc_ValueError, "%s must be a power of two, not %zd", name, a);
        return -1;
    }
    if ((size_t)a > max) {
        PyErr_Format(PyExc_ValueError, "%s %zd is above the limit of %zu", name, a, max);
        return -1;
    }
    *out = (size_t)a;
    return 0;
}

#define KPY_TIMEOUT_MAX 1e9  /* seconds (about 31 years) */

/* A number of seconds: a float or an integer (numpy's too), not a bool:
 * acquire(True) reads as threading's blocking=True, and would wait 1 s. */
static int kpy_is_seconds(PyObject *o) {
    return !PyBool_Check(o) && (PyFloat_Check(o) || PyIndex_Check(o));
}

int kpy_timeout_arg(PyObject *o, double *seconds, int *forever) {
    *forever = 0;
    if (o == Py_None) {
        *forever = 1;
        *seconds = 0.0;
        return 0;
    }
    if (!kpy_is_seconds(o)) {
        PyErr_Format(PyExc_TypeError, "timeout must be a number of seconds or None, not %.100s", Py_TYPE(o)->tp_name);
        return -1;
    }
    double t = PyFloat_AsDouble(o);
    if (t == -1.0 && PyErr_Occurred()) return -1;
    if (isnan(t)) {
        PyErr_SetString(PyExc_ValueError, "timeout must not be NaN");
        return -1;
    }
    if (t < 0) {
        PyErr_SetString(PyExc_ValueError, "timeout must not be negative (use None to wait forever)");
        return -1;
    }
    if (t > KPY_TIMEOUT_MAX) {
        PyErr_SetString(PyExc_OverflowError, "timeout value is too large (use None to wait forever)");
        return -1;
    }
    *seconds = t;
    return 0;
}

PyObject *kpy_no_memory(const char *what, size_t bytes) {
    PyErr_Format(PyExc_MemoryError, "%s: cannot allocate %zu bytes", what, bytes);
    return NULL;
}

int kpy_dict_steal(PyObject *dict, const char *key, PyObject *value) {
    if (!value) return -1;
    int r = PyDict_SetItemString(dict, key, value);
    Py_DECREF(value);
    return r;
}

/* ---- malloc ------------------------------------------------------------------ */

static const char *const malloc_kw[] = {"size", "zero", NULL};

static PyObject *kpy_malloc(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *o[2] = {NULL, NULL};
    if (nargs == 1 && !kwnames) o[0] = args[0];  /* malloc(n): no keyword matching */
    else if (kpy_parse_args("malloc", args, nargs, kwnames, malloc_kw, 1, 1, o) < 0) return NULL;
    Py_ssize_t size;
    if (kpy_size_arg(o[0], "size", 1, &size) < 0) return NULL;
    int zero = 0;
    if (o[1] && (zero = PyObject_IsTrue(o[1])) < 0) return NULL;
    void *p = zero ? kp_calloc(1, (size_t)size) : kp_malloc((size_t)size);
    if (!p) return kpy_no_memory("kpool.malloc", (size_t)size);
    kpy_state *st = state_of_module(module);
    PyObject *b = kpy_block_new(st->Block_type, p, size, KPY_HEAP, NULL, 0, &st->heap_spare);
    if (!b) {
        kp_free_sized(p, (size_t)size);
        return NULL;
    }
    kpy_live_add(&st->live[KPY_HEAP], 1);
    ((kpy_block *)b)->traced = kpy_track(p, (size_t)size) == 0;
    return b;
}

/* ---- statistics ---------------------------------------------------------------- */

/* qsort comparator: class records by size. */
static int class_cmp(const void *a, const void *b) {
    size_t x = ((const kp_class_stats *)a)->size, y = ((const kp_class_stats *)b)->size;
    return x < y ? -1 : x > y;
}

/* One class record as a dict (new reference) or NULL. */
static PyObject *class_dict(const kp_class_stats *c) {
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    if (kpy_dict_steal(d, "size", PyLong_FromSize_t(c->size)) < 0 ||
        kpy_dict_steal(d, "in_use", PyLong_FromSize_t(c->in_use)) < 0 ||
        kpy_dict_steal(d, "free_in_central", PyLong_FromSize_t(c->free_in_central)) < 0 ||
        kpy_dict_steal(d, "free_in_tcaches", PyLong_FromSize_t(c->free_in_tcaches)) < 0 ||
        kpy_dict_steal(d, "allocs", PyLong_FromUnsignedLongLong(c->allocs)) < 0 ||
        kpy_dict_steal(d, "frees", PyLong_FromUnsignedLongLong(c->frees)) < 0 ||
        kpy_dict_steal(d, "spans", PyLong_FromSize_t(c->spans)) < 0) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

#define SZ(field) kpy_dict_steal(d, #field, PyLong_FromSize_t(st->field)) < 0
#define U64(field) kpy_dict_steal(d, #field, PyLong_FromUnsignedLongLong(st->field)) < 0
#define DBL(field) kpy_dict_steal(d, #field, PyFloat_FromDouble(st->field)) < 0

/* kpool.stats() as a dict (new reference) or NULL. */
static PyObject *stats_dict(void) {
    kp_stats *st = PyMem_Calloc(1, sizeof(kp_stats));
    if (!st) return kpy_no_memory("kpool.stats", sizeof(kp_stats));
    st->struct_size = sizeof(kp_stats);
    PyObject *d = NULL, *classes = NULL;
    if (kp_stats_get(st) < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    d = PyDict_New();
    if (!d) goto done;
    if (kpy_dict_steal(d, "version", PyLong_FromUnsignedLong(st->version)) < 0 ||
        kpy_dict_steal(d, "enabled", PyBool_FromLong(st->enabled)) < 0 ||
        SZ(bytes_in_use) || SZ(bytes_requested) ||
        kpy_dict_steal(d, "requested_exact", PyBool_FromLong(st->requested_exact)) < 0 ||
        SZ(bytes_mapped) || SZ(bytes_released) || SZ(bytes_free_tcaches) || SZ(bytes_free_central) ||
        SZ(bytes_free_pageheap) || SZ(bytes_metadata) || SZ(bytes_small_spans) || SZ(bytes_span_waste) ||
        SZ(bytes_large) || SZ(bytes_pools) || SZ(bytes_arenas) || SZ(largest_free_span) || SZ(threads) ||
        U64(allocs) || U64(frees) || U64(tcache_hits) || U64(tcache_misses) || U64(central_fetches) ||
        U64(central_returns) || U64(pageheap_grows) || U64(large_allocs) || U64(lock_acquires) ||
        U64(lock_contended) || U64(lock_wait_ns) || U64(os_releases) || U64(uncached_ops) ||
        SZ(bytes_meshed) || U64(meshes) ||
        kpy_dict_steal(d, "tcaches_unavailable", PyBool_FromLong(st->tcaches_unavailable)) < 0 ||
        DBL(internal_fragmentation) || DBL(external_fragmentation))
        goto fail;
    size_t n = st->nclasses < KP_STATS_MAX_CLASSES ? st->nclasses : KP_STATS_MAX_CLASSES;
    qsort(st->classes, n, sizeof(kp_class_stats), class_cmp);
    classes = PyList_New((Py_ssize_t)n);
    if (!classes) goto fail;
    for (size_t i = 0; i < n; i++) {
        PyObject *c = class_dict(&st->classes[i]);
        if (!c) goto fail;
        PyList_SET_ITEM(classes, (Py_ssize_t)i, c);
    }
    if (PyDict_SetItemString(d, "classes", classes) < 0) goto fail;
    goto done;
fail:
    Py_CLEAR(d);
done:
    Py_XDECREF(classes);
    PyMem_Free(st);
    return d;
}

#undef SZ
#undef U64
#undef DBL

static PyObject *kpy_stats(PyObject *module, PyObject *unused) { return stats_dict(); }

static PyObject *kpy_stats_reset(PyObject *module, PyObject *unused) {
    kp_stats_reset();
    Py_RETURN_NONE;
}

static PyObject *kpy_trim(PyObject *module, PyObject *unused) {
    size_t n;
    Py_BEGIN_ALLOW_THREADS
    n = kp_trim();
    Py_END_ALLOW_THREADS
    return PyLong_FromSize_t(n);
}

static PyObject *kpy_thread_flush(PyObject *module, PyObject *unused) {
    kp_thread_flush();
    Py_RETURN_NONE;
}

/* ---- stress ------------------------------------------------------------------ */

#ifdef KPOOL_HAVE_STRESS
/* 1 if name is in the NULL-terminated list. */
static int in_list(const char *name, const char *const *list) {
    for (; *list; list++)
        if (strcmp(name, *list) == 0) return 1;
    return 0;
}

/* ", "-joined list as a new str, or NULL. */
static PyObject *join_list(const char *const *list) {
    PyObject *l = PyList_New(0);
    if (!l) return NULL;
    for (; *list; list++) {
        PyObject *s = PyUnicode_FromString(*list);
        if (!s || PyList_Append(l, s) < 0) {
            Py_XDECREF(s);
            Py_DECREF(l);
            return NULL;
        }
        Py_DECREF(s);
    }
    PyObject *sep = PyUnicode_FromString(", ");
    PyObject *r = sep ? PyUnicode_Join(sep, l) : NULL;
    Py_XDECREF(sep);
    Py_DECREF(l);
    return r;
}

/* ValueError naming the accepted values. Returns NULL. */
static PyObject *bad_name(const char *what, const char *name, const char *const *list) {
    PyObject *names = join_list(list);
    if (names) {
        PyErr_Format(PyExc_ValueError, "unknown %s '%s' (expected one of: %U)", what, name, names);
        Py_DECREF(names);
    }
    return NULL;
}
#endif

#ifdef KPOOL_HAVE_STRESS
/* duration=: None (no limit) or a number of seconds in [0.001, 1e9]. */
static int duration_arg(PyObject *o, double *out) {
    *out = 0.0;
    if (!o || o == Py_None) return 0;
    if (!kpy_is_seconds(o)) {
        PyErr_Format(PyExc_TypeError, "duration must be a number of seconds or None, not %.100s", Py_TYPE(o)->tp_name);
        return -1;
    }
    double d = PyFloat_AsDouble(o);
    if (d == -1.0 && PyErr_Occurred()) return -1;
    if (isnan(d) || d <= 0) {
        PyErr_SetString(PyExc_ValueError, "duration must be a positive number of seconds (or None for no limit)");
        return -1;
    }
    if (d > 1e9) {
        PyErr_SetString(PyExc_OverflowError, "duration is too large (at most 1e9 seconds; None for no limit)");
        return -1;
    }
    *out = d < 1e-3 ? 1e-3 : d;
    return 0;
}

/* 1 if the interpreter has begun to shut down (threading._shutdown runs:
 * the main thread is done), else 0. Read from threading's flag when the
 * module is loaded; never raises. The exit hook in kpool/__init__.py
 * cancels the runs as well, but hooks run last-registered-first, so a
 * ThreadPoolExecutor made after `import kpool` joins its workers before it:
 * this check lets such a worker's run end anyway. */
static int interpreter_exiting(void) {
    int r = 0;
    PyObject *name = PyUnicode_FromString("threading");
    PyObject *threading = name ? PyImport_GetModule(name) : NULL;  /* NULL, no error, if not imported */
    PyObject *flag = threading ? PyObject_GetAttrString(threading, "_SHUTTING_DOWN") : NULL;
    if (flag) r = PyObject_IsTrue(flag) == 1;
    Py_XDECREF(flag);
    Py_XDECREF(threading);
    Py_XDECREF(name);
    PyErr_Clear();  /* a missing flag or module means "no" */
    return r;
}

/* Ctrl-C and runs in other threads. Python handles SIGINT in the main
 * thread only, so a run in a worker thread would not notice it, and a main
 * thread that leaves `with ThreadPoolExecutor()` on KeyboardInterrupt joins
 * that worker for as long as its run lasts. While a run is in progress and
 * SIGINT has Python's default handler (signal.default_int_handler), kpool
 * puts a C handler in front of Python's: it counts the signal (one atomic
 * add, async-signal-safe) and calls the handler it replaced, so Python
 * still raises KeyboardInterrupt in the main thread; every run's wait loop
 * sees the count move within 50 ms and cancels its run. A run reads the
 * count before it installs the handler, so no SIGINT from then on is
 * missed.
 * Whose handler: kpool chains only to the C handler it found at its first
 * install (Python's), and installs only over that one (or finds its own
 * there): a handler some other C code put in front meanwhile, which would
 * chain back to kpool's, is left alone and the feature is off for that
 * run. kpool's handler takes the replaced one's SA_RESTART, SA_ONSTACK,
 * SA_NODEFER and mask; the last run to end puts the replaced handler back
 * (with the SA_RESTART that signal.siginterrupt may have set on kpool's
 * meanwhile), unless something has replaced kpool's since. A forked child
 * has no runs: it puts the replaced handler back at once.
 * The disposition is the process's, so this state is process-wide, not
 * per module; sigint_lock guards it (and is held across fork), and
 * `sigint_prev` is written before the handler that reads it is installed.
 * Without the GIL, a signal.signal() racing a run's start or end could be
 * undone; with the GIL both hold it. */
static pthread_mutex_t sigint_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t sigint_atfork_once = PTHREAD_ONCE_INIT;
static unsigned sigint_runs;          /* runs in progress with kpool's handler in front */
static int sigint_have_prev;          /* sigint_prev holds the handler kpool chains to */
static struct sigaction sigint_prev;
static atomic_uint sigint_count;      /* SIGINTs kpool's handler has seen */

static void sigint_cancel_runs(int sig, siginfo_t *info, void *ctx);

static void *sigint_handler_of(const struct sigaction *sa) {
    return (sa->sa_flags & SA_SIGINFO) ? (void *)sa->sa_sigaction : (void *)sa->sa_handler;
}
static int sigint_is_kpools(const struct sigaction *sa) {
    return (sa->sa_flags & SA_SIGINFO) && sa->sa_sigaction == sigint_cancel_runs;
}

static void sigint_cancel_runs(int sig, siginfo_t *info, void *ctx) {
    int saved_errno = errno;
    atomic_fetch_add_explicit(&sigint_count, 1, memory_order_relaxed);
    /* sigint_prev is never kpool's own handler (sigint_run_begin) */
    if (sigint_prev.sa_flags & SA_SIGINFO) {
        sigint_prev.sa_sigaction(sig, info, ctx);
    } else if (sigint_prev.sa_handler == SIG_DFL) {
        signal(sig, SIG_DFL);         /* not reached while Python's handler was there; be the default */
        raise(sig);
    } else if (sigint_prev.sa_handler != SIG_IGN) {
        sigint_prev.sa_handler(sig);
    }
    errno = saved_errno;
}

/* Put the replaced handler back if kpool's is in front. REQUIRES sigint_lock
 * (or a forked child's only thread). */
static void sigint_restore_locked(void) {
    struct sigaction now;
    if (sigaction(SIGINT, NULL, &now) != 0 || !sigint_is_kpools(&now)) return;
    struct sigaction back = sigint_prev;
    back.sa_flags = (back.sa_flags & ~SA_RESTART) | (now.sa_flags & SA_RESTART);
    (void)sigaction(SIGINT, &back, NULL);
}

static void sigint_atfork_prepare(void) { pthread_mutex_lock(&sigint_lock); }
static void sigint_atfork_parent(void) { pthread_mutex_unlock(&sigint_lock); }
static void sigint_atfork_child(void) {
    sigint_runs = 0;                  /* the runs' threads are not in the child */
    sigint_restore_locked();
    pthread_mutex_unlock(&sigint_lock);
}
static void sigint_register_atfork(void) {
    (void)pthread_atfork(sigint_atfork_prepare, sigint_atfork_parent, sigint_atfork_child);
}

/* 1 if SIGINT has Python's default handler, 0 if not; -1 + exception. */
static int sigint_is_python_default(void) {
    PyObject *signal_mod = PyImport_ImportModule("signal");
    if (!signal_mod) return -1;
    PyObject *current = PyObject_CallMethod(signal_mod, "getsignal", "i", SIGINT);
    PyObject *deflt = current ? PyObject_GetAttrString(signal_mod, "default_int_handler") : NULL;
    int r = deflt ? current == deflt : -1;
    Py_XDECREF(deflt);
    Py_XDECREF(current);
    Py_DECREF(signal_mod);
    return r;
}

/* At a run's start: put the handler in front (see above); *seen is the
 * count to compare with. 1 if this run counts in sigint_runs (call
 * sigint_run_end), 0 if not; -1 + exception. */
static int sigint_run_begin(unsigned *seen) {
    *seen = atomic_load_explicit(&sigint_count, memory_order_relaxed);
    int dflt = sigint_is_python_default();
    if (dflt <= 0) return dflt;
    (void)pthread_once(&sigint_atfork_once, sigint_register_atfork);
    pthread_mutex_lock(&sigint_lock);
    struct sigaction now;
    int counted = 0;
    if (sigaction(SIGINT, NULL, &now) == 0) {
        if (sigint_is_kpools(&now)) {
            counted = 1;
        } else if (!sigint_have_prev || sigint_handler_of(&now) == sigint_handler_of(&sigint_prev)) {
            struct sigaction mine;
            memset(&mine, 0, sizeof mine);
            mine.sa_sigaction = sigint_cancel_runs;
            mine.sa_flags = SA_SIGINFO | (now.sa_flags & (SA_RESTART | SA_ONSTACK | SA_NODEFER));
            mine.sa_mask = now.sa_mask;
            sigint_prev = now;        /* before the handler that reads it is installed */
            sigint_have_prev = 1;
            counted = sigaction(SIGINT, &mine, NULL) == 0;
        }
    }
    if (counted) sigint_runs++;
    pthread_mutex_unlock(&sigint_lock);
    return counted;
}

static void sigint_run_end(void) {
    pthread_mutex_lock(&sigint_lock);
    if (sigint_runs > 0 && --sigint_runs == 0) sigint_restore_locked();
    pthread_mutex_unlock(&sigint_lock);
}

/* cancel=: None, or an object with an is_set() method (threading.Event). */
static int cancel_arg(PyObject *o) {
    if (!o || o == Py_None) return 0;
    PyObject *m = PyObject_GetAttrString(o, "is_set");
    if (!m || !PyCallable_Check(m)) {
        Py_XDECREF(m);
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "cancel must be None or an object with an is_set() method (a threading.Event), "
                     "not %.100s", Py_TYPE(o)->tp_name);
        return -1;
    }
    Py_DECREF(m);
    return 0;
}
#endif

static PyObject *kpy_stress(PyObject *module, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"workload", "threads", "ops", "allocator", "seed", "verify", "size", "burst_bytes",
                             "duration", "cancel", NULL};
    PyObject *o_workload = NULL, *o_threads = NULL, *o_ops = NULL, *o_alloc = NULL, *o_seed = NULL;
    PyObject *o_size = NULL, *o_burst = NULL, *o_duration = NULL, *o_cancel = NULL;
    int verify = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O$OOOOpOOOO:stress", kwlist, &o_workload, &o_threads, &o_ops,
                                     &o_alloc, &o_seed, &verify, &o_size, &o_burst, &o_duration, &o_cancel))
        return NULL;
    const char *workload = "mixed", *allocator = "kpool";
    if (o_workload) {
        if (!PyUnicode_Check(o_workload)) {
            PyErr_Format(PyExc_TypeError, "workload must be a str, not %.100s", Py_TYPE(o_workload)->tp_name);
            return NULL;
        }
        if (!(workload = PyUnicode_AsUTF8(o_workload))) return NULL;
    }
    if (o_alloc) {
        if (!PyUnicode_Check(o_alloc)) {
            PyErr_Format(PyExc_TypeError, "allocator must be a str, not %.100s", Py_TYPE(o_alloc)->tp_name);
            return NULL;
        }
        if (!(allocator = PyUnicode_AsUTF8(o_alloc))) return NULL;
    }
    Py_ssize_t threads = 4, ops = 1000000, size = 0, burst = 0;
    if (o_threads && kpy_size_arg(o_threads, "threads", 0, &threads) < 0) return NULL;
    if (threads > 1024) {
        PyErr_SetString(PyExc_ValueError, "threads must be at most 1024");
        return NULL;
    }
    if (o_ops && kpy_size_arg(o_ops, "ops", 0, &ops) < 0) return NULL;
    if (o_size && kpy_size_arg(o_size, "size", 1, &size) < 0) return NULL;
    if (o_burst && kpy_size_arg(o_burst, "burst_bytes", 1, &burst) < 0) return NULL;
#ifdef KPOOL_HAVE_STRESS
    double duration;
    if (duration_arg(o_duration, &duration) < 0 || cancel_arg(o_cancel) < 0) return NULL;
    if (o_cancel == Py_None) o_cancel = NULL;
#else
    (void)o_duration;
    (void)o_cancel;
#endif
    unsigned long long seed = 1;
    if (o_seed) {
        if (PyFloat_Check(o_seed) || !PyIndex_Check(o_seed)) {
            PyErr_Format(PyExc_TypeError, "seed must be an int, not %.100s", Py_TYPE(o_seed)->tp_name);
            return NULL;
        }
        PyObject *v = PyNumber_Index(o_seed);
        if (!v) return NULL;
        seed = PyLong_AsUnsignedLongLong(v);
        Py_DECREF(v);
        if (seed == (unsigned long long)-1 && PyErr_Occurred()) {
            if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
                PyErr_Clear();
                PyErr_SetString(PyExc_OverflowError, "seed must be in 0..2**64-1");
            }
            return NULL;
        }
    }
#ifndef KPOOL_HAVE_STRESS
    (void)verify;
    PyErr_SetString(PyExc_NotImplementedError, "this build of kpool has no stress driver (csrc/stress/stress.c)");
    return NULL;
#else
    if (!in_list(workload, kps_workloads)) return bad_name("workload", workload, kps_workloads);
    if (!in_list(allocator, kps_allocators)) return bad_name("allocator", allocator, kps_allocators);
    kps_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.workload = workload;
    cfg.allocator = allocator;
    cfg.threads = (int)threads;
    cfg.ops = (uint64_t)ops;
    cfg.seed = (uint64_t)seed;
    cfg.verify = verify;
    cfg.size = (size_t)size;
    cfg.burst_bytes = (size_t)burst;
    cfg.duration = duration;
    char err[512] = "";
    kps_run *run = NULL;
    int rc;
    unsigned sigint_seen;
    int sigint_counted = sigint_run_begin(&sigint_seen);
    if (sigint_counted < 0) return NULL;
    Py_BEGIN_ALLOW_THREADS  /* setting up a large run maps and touches memory */
    rc = kps_start(&cfg, &run, err, sizeof err);
    Py_END_ALLOW_THREADS
    if (rc != 0 && sigint_counted) sigint_run_end();
    if (rc == -1) {
        PyErr_Format(PyExc_ValueError, "stress: %s", err[0] ? err : "bad configuration");
        return NULL;
    }
    if (rc != 0) {
        PyErr_Format(PyExc_RuntimeError, "stress: %s", err[0] ? err : "could not start threads");
        return NULL;
    }
    /* Wait in slices of 50 ms with the GIL released; between them, with the
     * GIL: signal handlers (Ctrl-C in the main thread: stop, then raise),
     * the cancel object, interpreter shutdown and Ctrl-C in any thread
     * (cancel). */
    int failed = 0;
    for (;;) {
        if (PyErr_CheckSignals() < 0) {
            failed = 1;
            kps_stop(run);
            break;
        }
        if (o_cancel) {
            PyObject *v = PyObject_CallMethod(o_cancel, "is_set", NULL);
            int set = v ? PyObject_IsTrue(v) : -1;
            Py_XDECREF(v);
            if (set < 0) {  /* is_set() raised: stop, and pass the exception on */
                failed = 1;
                kps_cancel(run);
                break;
            }
            if (set) {
                kps_cancel(run);
                o_cancel = NULL;  /* asked once: now wait for the workers */
            }
        }
        if (interpreter_exiting()) kps_cancel(run);
        if (sigint_counted && atomic_load_explicit(&sigint_count, memory_order_relaxed) != sigint_seen)
            kps_cancel(run);          /* Ctrl-C, whichever thread this is */
        int done;
        Py_BEGIN_ALLOW_THREADS
        done = kps_wait(run, 50);
        Py_END_ALLOW_THREADS
        if (done) break;
    }
    char *json;
    Py_BEGIN_ALLOW_THREADS
    json = kps_finish(run);
    Py_END_ALLOW_THREADS
    if (sigint_counted) sigint_run_end();
    if (failed) {  /* the exception from the signal handler or is_set() stays set */
        kps_free_json(json);
        return NULL;
    }
    if (!json) return kpy_no_memory("stress: the result", 4096);
    PyObject *text = PyUnicode_FromString(json);
    kps_free_json(json);
    if (!text) return NULL;
    PyObject *jmod = PyImport_ImportModule("json");
    PyObject *result = jmod ? PyObject_CallMethod(jmod, "loads", "O", text) : NULL;
    Py_XDECREF(jmod);
    Py_DECREF(text);
    if (!result) return NULL;
    if (!PyDict_Check(result)) {
        Py_DECREF(result);
        PyErr_SetString(PyExc_RuntimeError, "stress: the driver did not return a JSON object");
        return NULL;
    }
    PyObject *corrupt = PyDict_GetItemString(result, "corrupt");  /* borrowed */
    if (corrupt && PyObject_IsTrue(corrupt) == 1) {
        PyObject *zero = PyLong_FromLong(0);
        int bad = zero ? PyObject_RichCompareBool(corrupt, zero, Py_GT) : -1;
        Py_XDECREF(zero);
        if (bad != 0) {
            if (bad == 1) {
                kpy_state *st = state_of_module(module);
                PyObject *msg = PyDict_GetItemString(result, "error");
                if (msg && msg != Py_None)
                    PyErr_Format(st->CorruptionError, "stress %s/%s: %S", workload, allocator, msg);
                else
                    PyErr_Format(st->CorruptionError, "stress %s/%s: %S corrupt blocks", workload, allocator, corrupt);
            }
            Py_DECREF(result);
            return NULL;
        }
    }
    if (strcmp(allocator, "kpool") == 0 || strcmp(allocator, "kpool-pool") == 0) {
        if (kpy_dict_steal(result, "kpool_stats", stats_dict()) < 0) {
            Py_DECREF(result);
            return NULL;
        }
    }
    return result;
#endif
}

static PyObject *kpy_live_blocks(PyObject *module, PyObject *unused) {
    kpy_state *st = state_of_module(module);
    return Py_BuildValue("(nnn)", atomic_load_explicit(&st->live[KPY_HEAP], memory_order_relaxed),
                         atomic_load_explicit(&st->live[KPY_POOL], memory_order_relaxed),
                         atomic_load_explicit(&st->live[KPY_ARENA], memory_order_relaxed));
}

static PyObject *kpy_stress_cancel(PyObject *module, PyObject *unused) {
#ifdef KPOOL_HAVE_STRESS
    return PyLong_FromLong(kps_cancel_all());
#else
    return PyLong_FromLong(0);
#endif
}

/* ---- module definition ----------------------------------------------------------- */

PyDoc_STRVAR(malloc_doc,
"malloc($module, /, size, *, zero=False)\n--\n\n"
"Allocate size bytes from kpool's heap and return them as a kpool.Block.\n"
"zero=True zeroes the memory. malloc(0) returns an empty Block. Raises\n"
"TypeError for a non-int size, ValueError for a negative one, OverflowError\n"
"for 2**63 or more (not a Py_ssize_t) and MemoryError when out of memory or\n"
"address space.");
PyDoc_STRVAR(stats_doc,
"stats($module, /)\n--\n\n"
"A process-wide snapshot of the allocator's statistics as a dict: bytes_in_use,\n"
"bytes_requested, bytes_mapped, bytes_released, allocs, frees, tcache_hits,\n"
"central_fetches, pageheap_grows, lock_acquires, lock_contended, lock_wait_ns,\n"
"internal_fragmentation, external_fragmentation, where the free memory sits\n"
"(bytes_free_tcaches, bytes_free_central, bytes_free_pageheap), and classes:\n"
"one dict per size class (size, in_use, free_in_central, free_in_tcaches,\n"
"allocs, frees, spans), sorted by size.");
PyDoc_STRVAR(stats_reset_doc, "stats_reset($module, /)\n--\n\nZero the event counters (not the gauges such as bytes_in_use).");
PyDoc_STRVAR(trim_doc, "trim($module, /)\n--\n\nGive all idle memory back to the OS; returns the bytes released.");
PyDoc_STRVAR(thread_flush_doc, "thread_flush($module, /)\n--\n\nGive this thread's cached free blocks back to the shared lists.");
PyDoc_STRVAR(stress_doc,
"stress($module, /, workload='mixed', *, threads=4, ops=1000000, allocator='kpool', seed=1, verify=True,\n"
"       size=0, burst_bytes=0, duration=None, cancel=None)\n--\n\n"
"Run the multithreaded C stress driver with the GIL released and return its\n"
"result as a dict (ops, seconds, ops_per_sec, latency percentiles, RSS,\n"
"stopped, stop_reason, ...; for the kpool allocators also kpool_stats).\n\n"
"workload='mixed': one of pairs mixed random larson prodcons burst frag.\n"
"threads=4: worker threads (1..1024).\n"
"ops=1000000: operations over all threads (frag: small blocks; burst:\n"
"    ignored, burst_bytes sets its size). The driver's own memory does not\n"
"    grow with ops (frag's block arrays aside): latency percentiles come\n"
"    from one op in 1024, kept as a uniform sample of at most 2**22.\n"
"allocator='kpool': kpool, kpool-pool (fixed pools, pairs only), system\n"
"    (this process's malloc) or null (the driver's own cost).\n"
"seed=1: the random generator's seed, 0..2**64-1 (OverflowError outside).\n"
"verify=True: stamp every block and check it before it is freed; damaged\n"
"    or overlapping blocks raise kpool.CorruptionError.\n"
"size=0: the block size of pairs (0 = 32 bytes; other workloads ignore it).\n"
"burst_bytes=0: the bytes burst allocates (0 = 1 GiB; burst only).\n"
"duration=None: stop after that many seconds (None: no limit; less than\n"
"    0.001 counts as 0.001).\n"
"cancel=None: an object with is_set() (a threading.Event), polled every\n"
"    50 ms; once it is set the run stops.\n\n"
"A run that stops early returns what it did: ops counts the operations done\n"
"(ops_requested what was asked), stopped is True and stop_reason 'duration'\n"
"or 'cancel' (cancel=, kpool.stress_cancel(), Ctrl-C, interpreter exit).\n"
"Raises ValueError for an unknown workload or allocator or a bad size,\n"
"kpool.CorruptionError when verification finds damaged blocks and\n"
"KeyboardInterrupt (after stopping the workers) on Ctrl-C while the calling\n"
"thread is the main thread. Ctrl-C stops runs in other threads too (they\n"
"return with stop_reason 'cancel'), so a main thread leaving\n"
"`with ThreadPoolExecutor()` on KeyboardInterrupt does not wait for them;\n"
"this holds while SIGINT has Python's default handler: under a handler of\n"
"the program's own, SIGINT does not touch runs.\n\n"
"The defaults differ from the kpool-stress executable's on purpose: this\n"
"function checks (4 threads, verify on), while kpool-stress, the timing tool\n"
"that kpool.bench runs, defaults to 1 thread with verify off; pass\n"
"threads=1, verify=False for the same measurement.");
PyDoc_STRVAR(stress_cancel_doc,
"stress_cancel($module, /)\n--\n\n"
"Stop every kpool.stress() run in progress, in any thread: each returns\n"
"promptly with stopped=True, stop_reason='cancel' (a run still setting up\n"
"stops as its threads start). Returns how many runs were in progress,\n"
"those setting up included. kpool calls it when the interpreter exits, so\n"
"a run in a worker thread does not keep the process alive.");

PyDoc_STRVAR(live_blocks_doc,
"live_blocks($module, /)\n--\n\n"
"How many kpool.Block objects hold memory now, as a tuple (heap, pool,\n"
"arena): made by malloc(), BufferPool.acquire() and Arena.alloc(), and not\n"
"yet released, collected or (arena blocks) reset. The pytest plugin's leak\n"
"check reads it.");

static PyMethodDef module_methods[] = {
    {"malloc", (PyCFunction)(void (*)(void))kpy_malloc, METH_FASTCALL | METH_KEYWORDS, malloc_doc},
    {"stats", (PyCFunction)(void (*)(void))kpy_stats, METH_NOARGS, stats_doc},
    {"stats_reset", (PyCFunction)(void (*)(void))kpy_stats_reset, METH_NOARGS, stats_reset_doc},
    {"trim", (PyCFunction)(void (*)(void))kpy_trim, METH_NOARGS, trim_doc},
    {"thread_flush", (PyCFunction)(void (*)(void))kpy_thread_flush, METH_NOARGS, thread_flush_doc},
    {"stress", (PyCFunction)(void (*)(void))kpy_stress, METH_VARARGS | METH_KEYWORDS, stress_doc},
    {"stress_cancel", (PyCFunction)(void (*)(void))kpy_stress_cancel, METH_NOARGS, stress_cancel_doc},
    {"live_blocks", (PyCFunction)(void (*)(void))kpy_live_blocks, METH_NOARGS, live_blocks_doc},
    {NULL, NULL, 0, NULL},
};

/* Add obj to m under name without stealing the caller's reference. 0 or -1. */
static int add_ref(PyObject *m, const char *name, PyObject *obj) {
    Py_INCREF(obj);
    if (PyModule_AddObject(m, name, obj) < 0) {
        Py_DECREF(obj);
        return -1;
    }
    return 0;
}

/* A heap type from spec, bound to module m (new reference) or NULL. */
static PyTypeObject *make_type(PyObject *m, PyType_Spec *spec, int instantiable) {
    PyTypeObject *tp = (PyTypeObject *)PyType_FromModuleAndSpec(m, spec, NULL);
    if (!tp) return NULL;
#ifndef Py_TPFLAGS_DISALLOW_INSTANTIATION
    if (!instantiable) tp->tp_new = NULL;  /* 3.9: no flag for it */
#else
    (void)instantiable;
#endif
    return tp;
}

PyDoc_STRVAR(error_doc, "Base class of kpool's own exceptions.");
PyDoc_STRVAR(exhausted_doc,
"A bounded pool is at its capacity: raised by BufferPool.acquire and\n"
"ObjectPool.get at once with timeout=0 (their default), or when a wait of\n"
"timeout seconds ran out (also by acquire_async and get_async).\n\n"
"A subclass of both kpool.Error and the built-in TimeoutError, so\n"
"`except TimeoutError:` catches it as it catches other timeouts.");
PyDoc_STRVAR(corrupt_doc, "The stress driver's verification found damaged or overlapping blocks.");

#ifdef KPOOL_HAVE_STRESS
/* The NULL-terminated list as a tuple of str (new reference) or NULL. */
static PyObject *tuple_of(const char *const *list) {
    Py_ssize_t n = 0;
    while (list[n]) n++;
    PyObject *t = PyTuple_New(n);
    if (!t) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *s = PyUnicode_FromString(list[i]);
        if (!s) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, s);
    }
    return t;
}
#endif

static int module_exec(PyObject *m) {
    kpy_state *st = state_of_module(m);
    if (!(st->Block_type = make_type(m, &kpy_block_spec, 0))) return -1;
    if (!(st->BufferPool_type = make_type(m, &kpy_bufferpool_spec, 1))) return -1;
    if (!(st->Arena_type = make_type(m, &kpy_arena_spec, 1))) return -1;
    if (!(st->Error = PyErr_NewExceptionWithDoc("kpool.Error", error_doc, NULL, NULL))) return -1;
    /* PoolExhausted is a kpool.Error and a TimeoutError: `except TimeoutError` catches a wait that ran out */
    PyObject *exhausted_bases = PyTuple_Pack(2, st->Error, PyExc_TimeoutError);
    if (!exhausted_bases) return -1;
    st->PoolExhausted = PyErr_NewExceptionWithDoc("kpool.PoolExhausted", exhausted_doc, exhausted_bases, NULL);
    Py_DECREF(exhausted_bases);
    if (!st->PoolExhausted) return -1;
    if (!(st->CorruptionError = PyErr_NewExceptionWithDoc("kpool.CorruptionError", corrupt_doc, st->Error, NULL)))
        return -1;
    if (add_ref(m, "Block", (PyObject *)st->Block_type) < 0 ||
        add_ref(m, "BufferPool", (PyObject *)st->BufferPool_type) < 0 ||
        add_ref(m, "Arena", (PyObject *)st->Arena_type) < 0 || add_ref(m, "Error", st->Error) < 0 ||
        add_ref(m, "PoolExhausted", st->PoolExhausted) < 0 || add_ref(m, "CorruptionError", st->CorruptionError) < 0)
        return -1;
    if (PyModule_AddStringConstant(m, "__version__", kp_version()) < 0) return -1;
    if (PyModule_AddIntConstant(m, "HAVE_STRESS",
#ifdef KPOOL_HAVE_STRESS
                                1
#else
                                0
#endif
                                ) < 0)
        return -1;
    /* how the objects' state is guarded (kpy.h): "gil", "free-threaded",
     * or the test builds "emulated" and "emulated-unlocked" */
    if (PyModule_AddStringConstant(m, "_FT_MODE",
#if defined(KPY_NOGIL_EMULATE_UNLOCKED)
                                   "emulated-unlocked"
#elif defined(KPY_NOGIL_EMULATE)
                                   "emulated"
#elif defined(Py_GIL_DISABLED)
                                   "free-threaded"
#else
                                   "gil"
#endif
                                   ) < 0)
        return -1;
    if (PyModule_AddObject(m, "TRACEMALLOC_DOMAIN", PyLong_FromUnsignedLong(KPY_TRACEMALLOC_DOMAIN)) < 0) return -1;
    if (PyModule_AddObject(m, "POOL_MAX_BLOCK", PyLong_FromSize_t(KP_POOL_MAX_BLOCK)) < 0) return -1;
    if (PyModule_AddObject(m, "POOL_MAX_ALIGN", PyLong_FromSize_t(KP_POOL_MAX_ALIGN)) < 0) return -1;
#ifdef KPOOL_HAVE_STRESS
    if (PyModule_AddObject(m, "STRESS_WORKLOADS", tuple_of(kps_workloads)) < 0) return -1;
    if (PyModule_AddObject(m, "STRESS_ALLOCATORS", tuple_of(kps_allocators)) < 0) return -1;
#endif
    return 0;
}

static int module_traverse(PyObject *m, visitproc visit, void *arg) {
    kpy_state *st = state_of_module(m);
    if (!st) return 0;
    Py_VISIT(st->Block_type);
    Py_VISIT(st->BufferPool_type);
    Py_VISIT(st->Arena_type);
    Py_VISIT(st->Error);
    Py_VISIT(st->PoolExhausted);
    Py_VISIT(st->CorruptionError);
    return 0;
}

static int module_clear(PyObject *m) {
    kpy_state *st = state_of_module(m);
    if (!st) return 0;
    Py_CLEAR(st->Block_type);
    Py_CLEAR(st->BufferPool_type);
    Py_CLEAR(st->Arena_type);
    Py_CLEAR(st->Error);
    Py_CLEAR(st->PoolExhausted);
    Py_CLEAR(st->CorruptionError);
    kpy_spare_clear(&st->heap_spare);
    return 0;
}

static void module_free(void *m) { module_clear((PyObject *)m); }

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, (void *)module_exec},
#ifdef Py_mod_gil
#ifdef Py_GIL_DISABLED
    /* Block, BufferPool and Arena guard their own state (kpy.h, "Threads and
     * the GIL"): a free-threaded interpreter keeps the GIL off. */
    {Py_mod_gil, Py_MOD_GIL_NOT_USED},
#else
    /* a GIL build: the GIL guards the objects' state (the slot changes nothing there) */
    {Py_mod_gil, Py_MOD_GIL_USED},
#endif
#endif
    {0, NULL},
};

PyDoc_STRVAR(module_doc,
"kpool._core: the CPython binding of kpool's C allocator.\n\n"
"Use it through the package: import kpool.");

PyModuleDef kpy_moduledef = {
    PyModuleDef_HEAD_INIT,
    .m_name = "kpool._core",
    .m_doc = module_doc,
    .m_size = sizeof(kpy_state),
    .m_methods = module_methods,
    .m_slots = module_slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
    .m_free = module_free,
};

PyMODINIT_FUNC PyInit__core(void) { return PyModuleDef_Init(&kpy_moduledef); }
