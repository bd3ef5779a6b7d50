"""numpy arrays on kpool (NEP 49): kpool.numpy_handler() and kpool.use_for_numpy().

numpy takes an array's data buffer from the memory handler that is current
when the array is made, and the array keeps that handler to free its buffer
with: an array made under kpool's handler is freed by kpool wherever and
whenever it dies, and arrays made before, or elsewhere, keep their own
handler. numpy keeps the current handler in a context variable, so setting
it affects the current thread (or asyncio task, or contextvars.Context)
only. numpy has no Python-level setter; kpool._numpy calls numpy's C API
(PyDataMem_SetHandler).

Nothing here imports numpy until it is used: `import kpool` works without
numpy, and only these functions raise ImportError.
"""
import contextvars
import threading

__all__ = ["numpy_handler", "use_for_numpy"]


def _ext():
    """kpool._numpy (importing it imports numpy), or ImportError saying what is missing."""
    try:
        import numpy  # noqa: F401
    except ImportError as exc:
        raise ImportError("kpool.numpy_handler() and kpool.use_for_numpy() need numpy (1.22 or newer): "
                          "pip install numpy") from exc
    import importlib

    name = __name__.rpartition(".")[0] + "._numpy"
    try:
        _numpy = importlib.import_module(name)  # (`from . import` would hide the ModuleNotFoundError)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise
        raise ImportError("this kpool was built without numpy, so kpool._numpy is missing: reinstall it with "
                          "numpy available at build time (pip install kpool does that)") from exc
    except (ImportError, RuntimeError) as exc:  # import_array refused this numpy (older than 1.22)
        raise ImportError("kpool._numpy cannot use this numpy: %s" % exc) from exc
    return _numpy


def numpy_handler():
    """Return kpool's numpy memory handler: a PyCapsule named "mem_handler"
    holding a PyDataMem_Handler named "kpool" (NEP 49), always the same object.

    Its malloc, calloc, realloc and free are kpool's kp_malloc, kp_calloc,
    kp_realloc and kp_free_sized (numpy passes the size to free, so
    kpool.stats()'s bytes_requested stays exact until an array is resized
    in place: numpy's realloc does not pass the old size, and
    requested_exact turns False from then on). numpy's C API
    PyDataMem_SetHandler takes it; from Python use kpool.use_for_numpy().
    Raises ImportError without numpy or when kpool was built without it.
    """
    return _ext().handler()


# What each use_for_numpy() block replaced, innermost first, per context: a
# linked list (handler, before_global, rest). A ContextVar, so that threads
# and asyncio tasks using the same use_for_numpy object do not restore each
# other's. before_global: the handler the global mode replaced, if it was on
# when the block began (else _NONE).
_saved = contextvars.ContextVar("kpool.use_for_numpy", default=None)
_NONE = object()

# The global mode: the use_for_numpy(global_=True) objects not yet restored,
# and what the first of them replaced (the calling context's handler and
# _thread_handler). It ends when the last of them is restored, in any order.
_globals_lock = threading.Lock()
_active_globals = []
_global_base = None

# The handler that threads started through threading set first (the global
# mode), or None; read by the hook _hook_threads installs.
_thread_handler = None
_thread_hook_lock = threading.Lock()
_thread_hook_installed = False


def _hook_threads(ext):
    """Make every threading.Thread started from now on set _thread_handler
    (when not None) in its own context before its run() starts. Threads
    start with an empty context, where numpy's handler is numpy's default."""
    global _thread_hook_installed
    with _thread_hook_lock:
        if _thread_hook_installed:
            return
        original = getattr(threading.Thread, "_bootstrap_inner", None)
        if original is None:  # pragma: no cover - other Pythons: threads keep numpy's default
            return

        def _bootstrap_inner(self):
            handler = _thread_handler
            if handler is not None:
                try:
                    ext.set_handler(handler)
                except Exception:  # pragma: no cover - numpy refused: the thread keeps the default
                    pass
            return original(self)

        _bootstrap_inner.__wrapped__ = original
        threading.Thread._bootstrap_inner = _bootstrap_inner
        _thread_hook_installed = True


class use_for_numpy:
    """Make numpy allocate array data from kpool.

    ``with kpool.use_for_numpy(): ...`` sets kpool's handler
    (kpool.numpy_handler()) as numpy's for the block and restores the one
    before it afterwards, also when the block raises. numpy keeps its
    handler in a context variable, so the block affects the current thread
    or asyncio task only: other threads and tasks keep theirs, and asyncio
    tasks created inside the block inherit it (they copy the context).
    Arrays made inside keep kpool as their allocator after the block, and
    are freed by it whenever and wherever they die.

    ``kpool.use_for_numpy(global_=True)`` is process-wide and takes effect
    at the call, no ``with`` needed: kpool's handler becomes numpy's in the
    calling context (call it early in the main thread: asyncio tasks and
    contexts copied from it inherit it) and in every thread started through
    threading from then on. It stays until ``.restore()`` on the returned
    object (or the end of a ``with`` around it), which puts the previous
    handler back in the calling context and stops handing it to new
    threads; threads already started keep it. Several global objects nest
    in any order: the mode ends when the last of them is restored, and a
    ``with use_for_numpy()`` block that ends while it is on leaves kpool's
    handler in place. A restored object cannot be used again: ``with`` on
    it raises RuntimeError. Threads that are already running, or started
    with _thread.start_new_thread, keep their handler.

    Needs numpy 1.22 or newer; ImportError without it.
    """

    def __init__(self, global_=False):
        self._ext = _ext()
        self._global = bool(global_)
        self._active = False
        if self._global:
            self._start_global()

    # ---- per-context (the default) ------------------------------------------
    def __enter__(self):
        if self._global:
            if not self._active:
                raise RuntimeError("use_for_numpy(global_=True) was restored; "
                                   "make a new one to put kpool's handler back")
            return self
        ext = self._ext
        old = ext.set_handler(ext.handler())
        with _globals_lock:
            before_global = _global_base[0] if _active_globals else _NONE
        _saved.set((old, before_global, _saved.get()))
        return self

    def __exit__(self, exc_type, exc, tb):
        if self._global:
            self.restore()
            return False
        entry = _saved.get()
        if entry is None:  # pragma: no cover - an exit without its enter in this context
            raise RuntimeError("use_for_numpy: __exit__ in a context where the block was not entered")
        old, before_global, rest = entry
        _saved.set(rest)
        with _globals_lock:
            if _active_globals:
                # the global mode is on (begun before or inside the block): it stays
                old = self._ext.handler()
            elif before_global is not _NONE:
                # it was on when the block began and has ended since
                old = before_global
        self._ext.set_handler(old)
        return False

    # ---- process-wide -----------------------------------------------------------
    def _start_global(self):
        global _thread_handler, _global_base
        ext = self._ext
        handler = ext.handler()
        with _globals_lock:
            previous = ext.set_handler(handler)
            if not _active_globals:
                # inside with blocks, what the context had before the outermost
                entry = _saved.get()
                while entry is not None:
                    old, before_global, rest = entry
                    previous = old if before_global is _NONE else before_global
                    entry = rest
                _global_base = (previous, _thread_handler)
                _hook_threads(ext)
                _thread_handler = handler
            _active_globals.append(self)
            self._active = True

    def restore(self):
        """Undo use_for_numpy(global_=True): once every such object is
        restored (in any order), the handler before the first of them again
        in the calling context (at the end of a ``with use_for_numpy()``
        block, if called inside one), and new threads no longer get kpool's.
        Idempotent."""
        global _thread_handler, _global_base
        if not self._global:
            return
        with _globals_lock:
            if not self._active:
                return
            self._active = False
            _active_globals.remove(self)
            if _active_globals:
                return
            old, old_thread = _global_base
            _global_base = None
            _thread_handler = old_thread
            if _saved.get() is None:   # inside a block, the block's end restores it
                self._ext.set_handler(old)

    def __repr__(self):
        mode = "global, active" if self._active else ("global, restored" if self._global else "per context")
        return "<kpool.use_for_numpy %s>" % mode
