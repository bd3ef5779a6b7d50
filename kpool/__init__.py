"""kpool: a memory-pool allocator in C, shipped as a Python package.

Fast, measurable memory in three shapes on top of a general-purpose
size-class heap:

    kpool.malloc(size)                 a Block from the heap
    kpool.BufferPool(buffer_size)      fixed-size buffers, reused
    kpool.ObjectPool(factory)          reuse of expensive Python objects
    kpool.Arena()                      region allocation, freed at once

plus the allocator's statistics (kpool.stats(), kpool.stats_array()), the
multithreaded C stress driver (kpool.stress()) and the benchmark
(kpool.bench, ``python -m kpool bench``); ``python -m kpool`` runs a short
demonstration. Bounded pools raise kpool.PoolExhausted, a TimeoutError.

kpool can also be a whole program's malloc: kpool.run([...]) or
``python -m kpool run -- CMD`` runs a command with LD_PRELOAD set to the
library kpool.get_preload() returns (libkpool-malloc.so, also listed among
the package contents: a C library).

numpy arrays can live on kpool: ``with kpool.use_for_numpy(): ...`` (or
``kpool.use_for_numpy(global_=True)``) makes numpy allocate their data with
kpool's memory handler, kpool.numpy_handler() (NEP 49). tracemalloc sees
kpool's blocks in the domain kpool.TRACEMALLOC_DOMAIN. kpool.pytest_plugin,
which pytest loads by itself, adds --kpool-report and --kpool-fail-on-leak
(kpool memory per test, tests that leave Blocks alive) and the fixtures
kpool_stats and buffer_pool.

C code shares the same process-wide heap: the header kpool.h, in the folder
kpool.get_include() returns, documents the C API; link the library file
kpool.get_library() returns (libkpool.so, which pydoc lists among the
package contents: it is that C library, not a Python module).
"""

import os as _os
import sys as _sys
import types as _types

_HERE = _os.path.dirname(_os.path.abspath(__file__))


def _has_core(folder):
    """True if folder holds a kpool._core built for this interpreter."""
    from importlib.machinery import EXTENSION_SUFFIXES

    return any(_os.path.exists(_os.path.join(folder, "_core" + suffix)) for suffix in EXTENSION_SUFFIXES)


def _installed_copy():
    """In a source checkout that was never built in place (the current
    folder is the repository root, so `import kpool` finds the sources
    first), load the kpool that `pip install .` put on sys.path instead and
    return it; None if there is none."""
    import importlib.machinery
    import importlib.util

    others = [p for p in _sys.path
              if _os.path.realpath(_os.path.join(_os.path.abspath(p or _os.getcwd()), "kpool")) != _os.path.realpath(_HERE)]
    spec = importlib.machinery.PathFinder.find_spec(__name__, others)
    if spec is None or not spec.submodule_search_locations or not spec.origin:
        return None
    if not _has_core(_os.path.dirname(spec.origin)):
        return None
    module = importlib.util.module_from_spec(spec)
    _sys.modules[__name__] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        _sys.modules.pop(__name__, None)
        raise
    return module


if __name__ == "kpool" and not _has_core(_HERE) and _installed_copy() is not None:
    # sys.modules["kpool"] is now the installed package, which `import kpool`
    # returns; the rest of this file runs once more against it, harmlessly.
    pass

try:
    from . import _core  # noqa: F401
except ImportError as _exc:
    raise ImportError(
        "kpool's extension kpool._core is not built: install the package with `pip install .` "
        "(or build it in place with `pip install -e .`)") from _exc

from ._core import (  # noqa: F401  (re-exported API)
    TRACEMALLOC_DOMAIN,
    Arena,
    Block,
    BufferPool,
    CorruptionError,
    Error,
    PoolExhausted,
    __version__,
    malloc,
    stats,
    stats_reset,
    stress,
    stress_cancel,
    thread_flush,
    trim,
)
from ._objectpool import ObjectPool
from ._numpy_api import numpy_handler, use_for_numpy
from ._preload import get_preload, run
from ._aio import acquire_async as _acquire_async

# BufferPool is a C type; its coroutine method is written in Python (kpool/_aio.py)
BufferPool.acquire_async = _acquire_async
del _acquire_async

__all__ = [
    "__version__",
    "get_include",
    "get_library",
    "get_preload",
    "run",
    "malloc",
    "Block",
    "BufferPool",
    "ObjectPool",
    "Arena",
    "stats",
    "stats_array",
    "stats_reset",
    "trim",
    "thread_flush",
    "stress",
    "stress_cancel",
    "Error",
    "PoolExhausted",
    "CorruptionError",
    "numpy_handler",
    "use_for_numpy",
    "TRACEMALLOC_DOMAIN",
]


def _cancel_stress_runs_at_exit():
    """Stop the kpool.stress() runs still going when the interpreter exits.

    A run in a worker thread releases the GIL and runs until its ops are
    done; without this, the interpreter's join of that (non-daemon) thread
    at exit would wait for it, after Ctrl-C too. Registered with threading's
    exit hooks, which run before the threads are joined (atexit's run after).
    The runs themselves also notice the shutdown (for a ThreadPoolExecutor
    whose own hook, registered later, joins its workers first).
    """
    try:
        _core_module.stress_cancel()
    except Exception:  # pragma: no cover - never fails; the process is exiting anyway
        pass


def _register_exit_hook():
    import threading

    try:
        threading._register_atexit(_cancel_stress_runs_at_exit)
    except (AttributeError, RuntimeError):  # no such hook (other Pythons), or already shutting down
        import atexit

        atexit.register(_cancel_stress_runs_at_exit)


_register_exit_hook()


def get_include():
    """Return the folder that holds kpool.h (for C code built against kpool)."""
    return _os.path.join(_HERE, "include")


def get_library():
    """Return the path of the shared core library, libkpool.so.

    ``cffi.FFI().dlopen(kpool.get_library())`` reaches the same heap as the
    Python API: the extension is linked against this very file.
    """
    return _os.path.join(_HERE, "libkpool.so")


# numpy dtype of stats_array(): one record per size class
_CLASS_FIELDS = (
    ("size", "u8"),
    ("in_use", "u8"),
    ("free_in_central", "u8"),
    ("free_in_tcaches", "u8"),
    ("allocs", "u8"),
    ("frees", "u8"),
    ("spans", "u8"),
)


def stats_array(snapshot=None):
    """Return the per-size-class table as a numpy structured array.

    Fields: size, in_use, free_in_central, free_in_tcaches, allocs, frees,
    spans (all uint64), one row per class sorted by size. ``snapshot`` is a
    dict from kpool.stats() (a fresh one is taken by default). Needs numpy.
    """
    try:
        import numpy
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("kpool.stats_array() needs numpy: pip install numpy (or 'kpool[bench]')") from exc
    if snapshot is None:
        snapshot = stats()
    dtype = numpy.dtype(list(_CLASS_FIELDS))
    rows = [tuple(c.get(name, 0) for name, _ in _CLASS_FIELDS) for c in snapshot["classes"]]
    return numpy.array(rows, dtype=dtype)


class _Package(_types.ModuleType):
    """The type of the kpool module: kpool.bench is imported on first use,
    so that `import kpool` needs nothing beyond the standard library even if
    bench grows dependencies. (Methods of the module's type rather than
    module-level __getattr__/__dir__, which help(kpool) would list as API.)"""

    def __getattr__(self, name):
        if name == "bench":
            folder = _os.path.dirname(_os.path.abspath(self.__file__))
            if not _os.path.exists(_os.path.join(folder, "bench.py")):
                raise AttributeError("kpool.bench is not available in this installation")
            import importlib

            return importlib.import_module(".bench", self.__name__)
        raise AttributeError("module 'kpool' has no attribute %r" % (name,))

    def __dir__(self):
        names = set(vars(self)) | set(self.__all__)
        if _os.path.exists(_os.path.join(_os.path.dirname(_os.path.abspath(self.__file__)), "bench.py")):
            names.add("bench")
        return sorted(names)


_sys.modules[__name__].__class__ = _Package
