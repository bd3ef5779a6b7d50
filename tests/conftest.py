"""Shared fixtures for kpool's pytest suite.

The suite tests the installed package (``pip install .``). When pytest runs
from the repository root, the source folder kpool/ (which has no compiled
_core unless built in place) would shadow it on sys.path; it is dropped here
so that the installed kpool is the one imported.
"""
import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A shell without job control starts a background job (`cmd &`) with SIGINT
# ignored, and CPython then installs no KeyboardInterrupt handler: every
# Ctrl-C test would send a signal nobody receives (a run of the suite in the
# background hung in test_ctrl_c_stops_a_run that way). Give the suite, and
# through exec the programs it starts, the handler a terminal would.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _import_kpool():
    """Import kpool, preferring an installed build over an unbuilt source tree."""
    try:
        import kpool._core  # noqa: F401
    except ImportError:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != ROOT]
        for name in [m for m in sys.modules if m == "kpool" or m.startswith("kpool.")]:
            del sys.modules[name]
        import kpool._core  # noqa: F401
    import kpool

    return kpool


kpool = _import_kpool()
# the folder holding the kpool package that is being tested (for subprocesses)
KPOOL_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(kpool.__file__)))


def run_python(code, timeout=120, env=None, expect_rc=0):
    """Run code in a fresh interpreter that imports the same kpool; return
    the CompletedProcess (stdout+stderr text). Asserts the exit status."""
    e = dict(os.environ)
    e["PYTHONPATH"] = KPOOL_PARENT + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    e.pop("KPOOL_STATS", None)
    if env:
        e.update(env)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=timeout, env=e, cwd="/",
    )
    if expect_rc is not None:
        assert proc.returncode == expect_rc, "rc=%d\nstdout:\n%s\nstderr:\n%s" % (
            proc.returncode, proc.stdout[-4000:], proc.stderr[-4000:])
    return proc


@pytest.fixture
def python_script():
    """run_python as a fixture."""
    return run_python


def run_in_threads(target, n):
    """Run target() in n threads at once; re-raise the first exception one
    of them raised, after all have ended."""
    errors = []

    def run():
        try:
            target()
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def bytes_in_use():
    """kpool's bytes in use after a garbage collection."""
    gc.collect()
    return kpool.stats()["bytes_in_use"]


@pytest.fixture
def no_leak():
    """Asserts that a test leaves kpool's bytes in use where it found them."""
    gc.collect()
    before = bytes_in_use()
    yield
    gc.collect()
    after = bytes_in_use()
    assert after <= before, "kpool bytes in use grew from %d to %d" % (before, after)


def class_record(size, snapshot=None):
    """The stats() class record that serves a request of size bytes."""
    snap = snapshot if snapshot is not None else kpool.stats()
    for c in snap["classes"]:
        if c["size"] >= size:
            return c
    raise LookupError("no size class holds %d bytes" % size)
