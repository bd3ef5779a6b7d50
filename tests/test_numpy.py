"""numpy arrays on kpool (issue 16 item 1): kpool.numpy_handler(), a NEP 49
PyDataMem_Handler named "kpool", and kpool.use_for_numpy(), per context
(thread, asyncio task) or process-wide; numpy's own test_multiarray with
the handler set process-wide."""
import asyncio
import gc
import os
import re
import subprocess
import sys
import textwrap
import threading

import pytest

from conftest import KPOOL_PARENT, kpool, run_python

np = pytest.importorskip("numpy")
try:
    from numpy._core.multiarray import get_handler_name
except ImportError:  # numpy 1.x
    from numpy.core.multiarray import get_handler_name

DEFAULT = get_handler_name()  # numpy's own, "default_allocator"
MiB = 1 << 20


def stats():
    gc.collect()
    return kpool.stats()


def test_handler_is_a_mem_handler_capsule_named_kpool():
    h = kpool.numpy_handler()
    assert type(h).__name__ == "PyCapsule"
    assert '"mem_handler"' in repr(h)
    assert kpool.numpy_handler() is h
    assert kpool._numpy.HANDLER_NAME == "kpool"
    assert DEFAULT != "kpool"


def test_arrays_made_inside_use_kpool_and_outside_do_not():
    before = np.empty(10)
    with kpool.use_for_numpy():
        assert get_handler_name() == "kpool"
        made = [np.empty(100), np.zeros(1000), np.ones((3, 4)), np.arange(50), np.array([1, 2, 3]),
                np.empty(0), np.zeros(5, dtype=object), before.copy(), before + 1]
        for a in made:
            assert get_handler_name(a) == "kpool", a
        view = made[1][10:]
        assert get_handler_name(view) is None  # a view owns no data; its base does
        assert get_handler_name(view.base) == "kpool"
        assert get_handler_name(before) == DEFAULT
    assert get_handler_name() == DEFAULT
    after = np.empty(10)
    assert get_handler_name(after) == DEFAULT
    assert all(get_handler_name(a) == "kpool" for a in made)
    assert (made[1] == 0).all() and (made[2] == 1).all() and made[5].size == 0


def exact(snapshot):
    """True if bytes_requested can be compared exactly in this process: no
    free so far went without its size (kp_free, kp_realloc), else kpool
    estimates the figure (and clamps it at 0)."""
    return snapshot["requested_exact"]


def test_arrays_made_inside_are_freed_by_kpool_outside(no_leak):
    """The array keeps its handler: freed after the block (and in another
    thread) it goes back to kpool."""
    s0 = stats()
    with kpool.use_for_numpy():
        a = np.zeros(MiB // 8)        # calloc
        b = np.empty(3000, np.uint8)  # malloc
        c = np.ones(100)
    s1 = stats()
    assert s1["allocs"] - s0["allocs"] >= 3   # (np.ones may make a temporary too)
    assert s1["bytes_in_use"] - s0["bytes_in_use"] >= a.nbytes + b.nbytes + c.nbytes
    if exact(s0):
        assert s1["bytes_requested"] - s0["bytes_requested"] == a.nbytes + b.nbytes + c.nbytes
    del a
    t = threading.Thread(target=lambda: b.__setitem__(slice(None), 7))
    t.start()
    t.join()
    holder = [b]
    del b
    t = threading.Thread(target=holder.clear)  # the last reference dies in another thread
    t.start()
    t.join()
    del c
    s2 = stats()
    assert s2["bytes_in_use"] == s0["bytes_in_use"]
    assert s2["frees"] - s1["frees"] == 3
    if exact(s0):
        assert s2["bytes_requested"] == s0["bytes_requested"]


def test_stats_count_numpy_arrays():
    """allocs and frees count each array, bytes_in_use rises by at least the
    bytes and falls back."""
    sizes = [64, 4096, 65536, MiB]
    s0 = stats()
    with kpool.use_for_numpy():
        arrays = [np.empty(n, np.uint8) for n in sizes] + [np.zeros(n, np.uint8) for n in sizes]
    s1 = stats()
    assert s1["allocs"] - s0["allocs"] == len(arrays)
    assert s1["bytes_in_use"] - s0["bytes_in_use"] >= 2 * sum(sizes)
    if exact(s0):
        assert s1["bytes_requested"] - s0["bytes_requested"] == 2 * sum(sizes)
    del arrays
    s2 = stats()
    assert s2["frees"] - s1["frees"] == 2 * len(sizes)
    assert s2["bytes_in_use"] == s0["bytes_in_use"]
    if exact(s0):
        assert s2["bytes_requested"] == s0["bytes_requested"]


def test_sized_frees_keep_bytes_requested_exact():
    """In a fresh process (where no unsized free has made kpool estimate the
    figure yet): numpy's frees tell kpool the size, so bytes_requested
    follows the arrays' bytes exactly and requested_exact stays True."""
    proc = run_python(
        """
        import gc, numpy as np, kpool
        gc.collect()
        s0 = kpool.stats()
        with kpool.use_for_numpy():
            arrays = [np.empty(n, np.uint8) for n in (1, 64, 1000, 4096, 65536, 1 << 20, 5 << 20)]
            arrays += [np.zeros(n) for n in (3, 500, 70000)] + [np.ones((7, 9)), np.arange(1000) * 2]
        s1 = kpool.stats()
        nbytes = sum(a.nbytes for a in arrays)
        del arrays
        gc.collect()
        s2 = kpool.stats()
        print(s0["requested_exact"], s1["bytes_requested"] - s0["bytes_requested"] == nbytes,
              s2["bytes_requested"] == s0["bytes_requested"], s2["requested_exact"])
        """)
    assert proc.stdout.split() == ["True"] * 4


def test_resize_goes_through_kpool_realloc():
    """ndarray.resize reallocates through the array's own handler (kp_realloc),
    also after the block. (A moving kp_realloc frees the old block without
    its size, so bytes_requested is exact only up to that block's class.)"""
    s0 = stats()
    with kpool.use_for_numpy():
        a = np.arange(1000, dtype=np.int64)
    a.resize(200000, refcheck=False)
    assert get_handler_name(a) == "kpool"
    assert (a[:1000] == np.arange(1000)).all() and (a[1000:] == 0).all()
    s1 = stats()
    assert s1["bytes_in_use"] - s0["bytes_in_use"] >= 200000 * 8
    a.resize(10, refcheck=False)
    assert list(a) == list(range(10))
    del a
    s2 = stats()
    assert s2["bytes_in_use"] == s0["bytes_in_use"]
    assert s2["allocs"] - s0["allocs"] == s2["frees"] - s0["frees"]


def test_memory_is_kpools():
    """The data pointer of an array made inside is a kpool block."""
    import ctypes

    lib = ctypes.CDLL(kpool.get_library())
    lib.kp_usable_size.restype = ctypes.c_size_t
    lib.kp_usable_size.argtypes = [ctypes.c_void_p]
    with kpool.use_for_numpy():
        a = np.empty(1000, np.uint8)
    out = np.empty(1000, np.uint8)
    assert lib.kp_usable_size(a.ctypes.data) >= 1000
    assert lib.kp_usable_size(out.ctypes.data) == 0


def test_handler_is_restored_after_an_exception():
    with pytest.raises(ZeroDivisionError):
        with kpool.use_for_numpy():
            assert get_handler_name() == "kpool"
            1 / 0
    assert get_handler_name() == DEFAULT


def test_nested_and_reused_blocks():
    scope = kpool.use_for_numpy()
    with scope:
        with kpool.use_for_numpy():
            assert get_handler_name() == "kpool"
        assert get_handler_name() == "kpool"
        with scope:  # the same object again, nested
            assert get_handler_name() == "kpool"
        assert get_handler_name() == "kpool"
    assert get_handler_name() == DEFAULT
    with scope:
        assert get_handler_name() == "kpool"
    assert get_handler_name() == DEFAULT


def test_threads_see_the_handler_only_in_their_own_context():
    """A block in one thread leaves the others (and threads it starts) on
    numpy's default; two threads inside their own blocks at the same time
    each get kpool and each restores its own."""
    inside = threading.Barrier(3)
    leave = threading.Barrier(3)
    seen = {}

    def in_block(name):
        with kpool.use_for_numpy():
            inside.wait()
            seen[name] = (get_handler_name(), get_handler_name(np.empty(10)))
            child = []
            t = threading.Thread(target=lambda: child.append(get_handler_name(np.empty(10))))
            t.start()
            t.join()
            seen[name + "-child"] = child[0]
            leave.wait()
        seen[name + "-after"] = get_handler_name(np.empty(10))

    def outside():
        inside.wait()
        seen["outside"] = (get_handler_name(), get_handler_name(np.empty(10)))
        leave.wait()

    threads = [threading.Thread(target=in_block, args=("a",)), threading.Thread(target=in_block, args=("b",)),
               threading.Thread(target=outside)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen["a"] == seen["b"] == ("kpool", "kpool")
    assert seen["outside"] == (DEFAULT, DEFAULT)
    assert seen["a-child"] == seen["b-child"] == DEFAULT  # a new thread starts with an empty context
    assert seen["a-after"] == seen["b-after"] == DEFAULT
    assert get_handler_name() == DEFAULT


def test_asyncio_tasks_see_the_handler_only_in_their_own_context():
    async def main():
        entered, done = asyncio.Event(), asyncio.Event()
        seen = {}

        async def in_block():
            with kpool.use_for_numpy():
                entered.set()
                await asyncio.sleep(0)
                seen["inside"] = get_handler_name(np.empty(8))
                child = asyncio.ensure_future(asyncio.sleep(0, result=None))
                await child

                async def spawned():
                    return get_handler_name(np.empty(8))
                seen["spawned"] = await asyncio.create_task(spawned())  # copies this context
                await done.wait()
                seen["inside-later"] = get_handler_name()
            seen["after"] = get_handler_name()

        async def other():
            await entered.wait()
            seen["other"] = (get_handler_name(), get_handler_name(np.empty(8)))
            done.set()

        await asyncio.gather(in_block(), other())
        seen["main"] = get_handler_name()
        return seen

    seen = asyncio.run(main())
    assert seen == {"inside": "kpool", "spawned": "kpool", "inside-later": "kpool", "after": DEFAULT,
                    "other": (DEFAULT, DEFAULT), "main": DEFAULT}


# The start of the subprocess scripts below: numpy, kpool, and the handler a
# new threading.Thread's first array gets.
HANDLER_SCRIPT = """
import threading, numpy as np, kpool
try:
    from numpy._core.multiarray import get_handler_name
except ImportError:
    from numpy.core.multiarray import get_handler_name
def in_thread():
    out = []
    t = threading.Thread(target=lambda: out.append(get_handler_name(np.empty(4))))
    t.start(); t.join()
    return out[0]
"""


def test_global_mode_reaches_new_threads_and_tasks_and_restores():
    proc = run_python(HANDLER_SCRIPT + textwrap.dedent(
        """
        import asyncio
        async def task():
            return get_handler_name(np.empty(4))
        print("before", get_handler_name(), in_thread())
        g = kpool.use_for_numpy(global_=True)
        print("global", get_handler_name(np.empty(4)), in_thread(), asyncio.run(task()))
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(2) as ex:
            print("executor", ex.submit(lambda: get_handler_name(np.empty(4))).result())
        class Sub(threading.Thread):
            def run(self):
                self.got = get_handler_name(np.empty(4))
        s = Sub(); s.start(); s.join()
        print("subclass", s.got)
        with kpool.use_for_numpy():
            pass
        print("after-block", get_handler_name())
        g.restore(); g.restore()
        print("restored", get_handler_name(), in_thread())
        with kpool.use_for_numpy(global_=True):
            print("with-global", get_handler_name(), in_thread())
        print("end", get_handler_name(), in_thread(), repr(g))
        try:
            with g:
                pass
        except RuntimeError as e:
            print("reenter", "RuntimeError", get_handler_name())
        """))
    d = {line.split()[0]: line.split()[1:] for line in proc.stdout.splitlines()}
    default = d["before"][0]
    assert d["before"] == [default, default] and default != "kpool"
    assert d["global"] == ["kpool", "kpool", "kpool"]
    assert d["executor"] == ["kpool"] and d["subclass"] == ["kpool"]
    assert d["after-block"] == ["kpool"]
    assert d["restored"] == [default, default]
    assert d["with-global"] == ["kpool", "kpool"]
    assert d["end"][:2] == [default, default] and "restored" in " ".join(d["end"])
    assert d["reenter"] == ["RuntimeError", default]


def test_global_objects_nest_in_any_order_and_with_blocks():
    """Two global objects restored out of order used to leave the default
    handler while one was active, then kpool's for good; a global begun
    inside a with block was undone at the block's end."""
    proc = run_python(HANDLER_SCRIPT + textwrap.dedent(
        """
        def show(tag):
            print(tag, get_handler_name(), in_thread())
        show("start")
        g1 = kpool.use_for_numpy(global_=True)
        g2 = kpool.use_for_numpy(global_=True)
        g1.restore()
        show("g1-restored")
        g2.restore()
        show("both-restored")
        with kpool.use_for_numpy():
            g3 = kpool.use_for_numpy(global_=True)
        show("after-block-g3")
        g3.restore()
        show("g3-restored")
        g4 = kpool.use_for_numpy(global_=True)
        with kpool.use_for_numpy():
            g4.restore()
            show("g4-restored-inside")
        show("after-block-g4")
        """))
    d = {line.split()[0]: line.split()[1:] for line in proc.stdout.splitlines()}
    default = d["start"][0]
    assert default != "kpool" and d["start"] == [default, default]
    assert d["g1-restored"] == ["kpool", "kpool"]
    assert d["both-restored"] == [default, default]
    assert d["after-block-g3"] == ["kpool", "kpool"]
    assert d["g3-restored"] == [default, default]
    assert d["g4-restored-inside"] == ["kpool", default]
    assert d["after-block-g4"] == [default, default]


def test_global_mode_and_threads_already_running_or_not_from_threading():
    """Threads already running when the global mode starts, and threads
    started with _thread.start_new_thread, keep their handler; a thread
    started during it keeps kpool's after restore()."""
    proc = run_python(HANDLER_SCRIPT + textwrap.dedent(
        """
        import _thread
        go_early, go_during, done = threading.Event(), threading.Event(), []
        def early():
            go_early.wait(10)
            print("early", get_handler_name(), get_handler_name(np.empty(4)))
        def during():
            go_during.wait(10)
            print("during-after-restore", get_handler_name(), get_handler_name(np.empty(4)))
        def raw():
            print("raw", get_handler_name())
            done.append(1)
        t1 = threading.Thread(target=early); t1.start()
        g = kpool.use_for_numpy(global_=True)
        t2 = threading.Thread(target=during); t2.start()
        go_early.set(); t1.join()
        _thread.start_new_thread(raw, ())
        while not done:
            pass
        g.restore()
        go_during.set(); t2.join()
        print("main", get_handler_name())
        """))
    d = {line.split()[0]: line.split()[1:] for line in proc.stdout.splitlines()}
    default = d["main"][0]
    assert default != "kpool"
    assert d["early"] == [default, default]
    assert d["raw"] == [default]
    assert d["during-after-restore"] == ["kpool", "kpool"]


def test_import_kpool_without_numpy():
    """numpy missing at run time: kpool imports and works, and only the
    numpy functions raise ImportError."""
    proc = run_python(
        """
        import sys
        class NoNumpy:
            def find_spec(self, name, path=None, target=None):
                if name == "numpy" or name.startswith("numpy."):
                    raise ImportError("no numpy here")
        sys.meta_path.insert(0, NoNumpy())
        import kpool
        kpool.malloc(10).release()
        for f in (kpool.numpy_handler, kpool.use_for_numpy):
            try:
                f()
            except ImportError as e:
                print("ImportError", "numpy" in str(e))
            else:
                print("no error")
        print("numpy" in sys.modules, "kpool._numpy" in sys.modules)
        """)
    assert proc.stdout.split() == ["ImportError", "True", "ImportError", "True", "False", "False"]


def test_kpool_built_without_numpy_says_so():
    """A kpool built where numpy was missing has no kpool._numpy: the
    functions say to reinstall with numpy at build time."""
    proc = run_python(
        """
        import sys
        class NoExtension:
            def find_spec(self, name, path=None, target=None):
                if name == "kpool._numpy":
                    raise ModuleNotFoundError("No module named 'kpool._numpy'", name="kpool._numpy")
        sys.meta_path.insert(0, NoExtension())
        import kpool
        try:
            kpool.numpy_handler()
        except ImportError as e:
            print(type(e).__name__, "built without numpy" in str(e))
        """)
    assert proc.stdout.split() == ["ImportError", "True"]


def test_extension_was_built_against_numpy_2():
    """pyproject.toml asks for numpy >= 2 at build time; a build against 2.x
    targets the 1.22 C API, so it loads under any numpy from 1.22 on."""
    with open(os.path.join(os.path.dirname(__file__), os.pardir, "pyproject.toml")) as f:
        text = f.read()
    requires = re.search(r"\[build-system\].*?requires\s*=\s*\[(.*?)\]", text, re.S).group(1)
    assert '"numpy>=2"' in requires
    assert kpool._numpy.__file__.startswith(os.path.dirname(kpool.__file__))


# ---- numpy's own tests with the handler set process-wide ---------------------------

PLUGINS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plugins")
# a cross-section of test_multiarray that makes, resizes, views, pickles and frees arrays
SHORT_K = ("TestCreation or TestResize or TestZeroSizeFlexible or TestNewBufferProtocol or TestAlignment "
           "or TestHashing or TestAttributes or TestAssignment")


def run_numpy_tests(tmp_path, *args, timeout):
    tests = "numpy._core.tests.test_multiarray" if np.lib.NumpyVersion(np.__version__) >= "2.0.0" \
        else "numpy.core.tests.test_multiarray"
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([PLUGINS, KPOOL_PARENT] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "kpool_numpy_global", "-p", "no:cacheprovider", "-q",
         "--pyargs", tests, *args],
        capture_output=True, text=True, timeout=timeout, env=env, cwd=str(tmp_path))
    out = proc.stdout + proc.stderr
    summary = out.strip().splitlines()[-1]
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed)",
                                                 summary)}
    line = re.search(r"kpool-numpy: handler=(\S+) allocs=(\d+)", out)
    assert line, out[-3000:]
    assert proc.returncode == 0, out[-6000:]
    assert line.group(1) == "kpool"         # still set at the end
    assert int(line.group(2)) > 1000        # numpy's arrays did come from kpool
    assert counts.get("failed", 0) == 0 and counts.get("error", 0) == 0 and counts.get("errors", 0) == 0
    print(summary)
    return counts


def test_numpy_multiarray_subset_with_the_handler(tmp_path):
    counts = run_numpy_tests(tmp_path, "-k", SHORT_K, timeout=600)
    assert counts["passed"] >= 100


@pytest.mark.slow
def test_numpy_multiarray_with_the_handler(tmp_path):
    """All of numpy's test_multiarray (about 14000 tests, minutes)."""
    counts = run_numpy_tests(tmp_path, timeout=1800)
    assert counts["passed"] >= 10000


def test_set_handler_checks_its_argument_and_returns_the_previous_one():
    """kpool._numpy.set_handler: TypeError for anything but a "mem_handler"
    capsule or None; returns the handler it replaced; None is numpy's default."""
    from kpool import _numpy

    for bad in (1, "kpool", object()):
        with pytest.raises(TypeError):
            _numpy.set_handler(bad)
    before = get_handler_name()
    prev = _numpy.set_handler(kpool.numpy_handler())
    try:
        assert get_handler_name() == "kpool"
        assert _numpy.set_handler(kpool.numpy_handler()) is not None
        assert get_handler_name() == "kpool"
    finally:
        _numpy.set_handler(prev)
    assert get_handler_name() == before
    prev2 = _numpy.set_handler(None)
    try:
        assert get_handler_name() == "default_allocator"
    finally:
        _numpy.set_handler(prev2)
    assert get_handler_name() == before
