"""pytest plugin for running numpy's own tests with kpool's numpy handler.

Loaded with ``-p kpool_numpy_global`` (this folder on PYTHONPATH): at
configure time, before anything is collected, kpool.use_for_numpy(global_=True)
makes kpool numpy's allocator process-wide (the main thread's context and
every thread started afterwards). At the end it prints one line,

    kpool-numpy: handler=kpool allocs=N frees=N bytes_requested_delta=N

so the caller can check that numpy's tests ran on kpool, and that the
handler was still in place at the end.
"""
import kpool

_state = {}


def pytest_configure(config):
    _state["scope"] = kpool.use_for_numpy(global_=True)
    _state["before"] = kpool.stats()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    import gc

    from numpy import __version__ as numpy_version

    try:
        from numpy._core.multiarray import get_handler_name
    except ImportError:  # numpy 1.x
        from numpy.core.multiarray import get_handler_name
    gc.collect()
    before, now = _state["before"], kpool.stats()
    terminalreporter.write_line(
        "kpool-numpy: handler=%s allocs=%d frees=%d bytes_requested_delta=%d numpy=%s" % (
            get_handler_name(), now["allocs"] - before["allocs"], now["frees"] - before["frees"],
            now["bytes_requested"] - before["bytes_requested"], numpy_version))
