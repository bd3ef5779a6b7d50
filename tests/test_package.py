"""The package: version, get_include/get_library, the exported API, stubs,
docstrings and the lazy kpool.bench."""
import os
import subprocess
import sys

import pytest

from conftest import kpool, run_python

API = [
    "__version__", "get_include", "get_library", "malloc", "Block", "BufferPool", "ObjectPool", "Arena",
    "stats", "stats_array", "stats_reset", "trim", "thread_flush", "stress", "stress_cancel", "Error",
    "PoolExhausted", "CorruptionError",
]


def test_api_names_exist():
    for name in API:
        assert hasattr(kpool, name), name
    assert set(API) <= set(kpool.__all__)


def test_version_matches_the_c_library():
    import re

    assert re.fullmatch(r"\d+\.\d+\.\d+.*", kpool.__version__)
    with open(os.path.join(kpool.get_include(), "kpool.h")) as f:
        assert '"%s"' % kpool.__version__ in f.read()


def test_get_include_holds_kpool_h():
    inc = kpool.get_include()
    assert os.path.isdir(inc)
    assert os.path.isfile(os.path.join(inc, "kpool.h"))


def test_get_library_is_the_shared_core():
    lib = kpool.get_library()
    assert os.path.isfile(lib)
    assert os.path.basename(lib) == "libkpool.so"
    with open(lib, "rb") as f:
        assert f.read(4) == b"\x7fELF"


def test_extension_links_the_shipped_library():
    """_core resolves libkpool.so from its own folder ($ORIGIN): one heap."""
    core = kpool._core.__file__
    with open("/proc/self/maps") as f:
        maps = f.read()
    libs = {line.split()[-1] for line in maps.splitlines() if line.endswith("libkpool.so")}
    assert libs, "libkpool.so is not mapped"
    assert {os.path.realpath(p) for p in libs} == {os.path.realpath(kpool.get_library())}
    assert os.path.dirname(os.path.realpath(core)) == os.path.dirname(os.path.realpath(kpool.get_library()))


def test_stress_executable_is_shipped():
    exe = os.path.join(os.path.dirname(kpool.get_library()), "kpool-stress")
    if not os.path.exists(os.path.join(os.path.dirname(__file__), os.pardir, "csrc", "stress", "main.c")) \
            and not os.path.exists(exe):
        pytest.skip("no stress driver in this tree")
    assert os.access(exe, os.X_OK)


def test_c_program_builds_against_get_include(tmp_path):
    """A C program compiled with -I get_include() and linked with get_library()
    uses the same heap API."""
    import shutil

    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    src = tmp_path / "t.c"
    src.write_text(
        '#include <kpool.h>\n#include <string.h>\n'
        "int main(void){ char *p = kp_malloc(100); if(!p) return 2; memset(p,1,100);"
        " if(!kp_owns(p)) return 3; kp_free(p); return strcmp(kp_version(), KPOOL_VERSION_STRING) != 0; }\n")
    libdir = os.path.dirname(kpool.get_library())
    exe = tmp_path / "t"
    subprocess.run([cc, "-std=c11", "-I", kpool.get_include(), str(src), "-o", str(exe), libdir + "/libkpool.so",
                    "-Wl,-rpath," + libdir], check=True)
    assert subprocess.run([str(exe)]).returncode == 0


def test_exception_hierarchy():
    assert issubclass(kpool.Error, Exception)
    assert issubclass(kpool.PoolExhausted, kpool.Error)
    assert issubclass(kpool.CorruptionError, kpool.Error)
    assert not issubclass(kpool.PoolExhausted, kpool.CorruptionError)
    assert kpool.PoolExhausted.__module__ == "kpool"


def test_pool_exhausted_is_a_timeout_error():
    """Issue 15: PoolExhausted is caught by `except TimeoutError` (and stays a kpool.Error)."""
    assert issubclass(kpool.PoolExhausted, TimeoutError)
    assert issubclass(kpool.PoolExhausted, OSError)       # as TimeoutError is
    assert not issubclass(kpool.Error, TimeoutError) and not issubclass(kpool.CorruptionError, TimeoutError)
    pool = kpool.BufferPool(64, capacity=1)
    held = pool.acquire()
    with pytest.raises(TimeoutError) as info:
        pool.acquire()
    assert type(info.value) is kpool.PoolExhausted and "exhausted" in str(info.value)
    assert info.value.errno is None
    objs = kpool.ObjectPool(object, capacity=1)
    o = objs.get()
    try:
        objs.get(timeout=0.01)
    except TimeoutError as e:
        assert isinstance(e, kpool.Error)
    else:
        raise AssertionError("no PoolExhausted")
    e = kpool.PoolExhausted("msg")
    assert str(e) == "msg" and e.args == ("msg",)
    import pickle
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is kpool.PoolExhausted and str(back) == "msg"
    assert "TimeoutError" in kpool.PoolExhausted.__doc__
    held.release()
    objs.put(o)
    pool.close()


def test_default_timeout_is_zero_and_documented():
    """acquire() and get() fail fast by default (timeout=0), unlike queue.Queue.get;
    the docstrings say so and say how to wait."""
    import inspect
    import time

    assert inspect.signature(kpool.BufferPool.acquire).parameters["timeout"].default == 0.0
    assert inspect.signature(kpool.ObjectPool.get).parameters["timeout"].default == 0.0
    assert inspect.signature(kpool.ObjectPool.borrow).parameters["timeout"].default == 0.0
    assert inspect.signature(kpool.ObjectPool.get_async).parameters["timeout"].default is None
    assert inspect.signature(kpool.BufferPool.acquire_async).parameters["timeout"].default is None
    for fn in (kpool.BufferPool.acquire, kpool.ObjectPool.get):
        doc = " ".join(fn.__doc__.split())
        assert "The default, 0, never waits" in doc and "queue.Queue.get" in doc, fn
        assert "None waits" in doc and "TimeoutError" in doc, fn
    for fn in (kpool.BufferPool.acquire_async, kpool.ObjectPool.get_async):
        doc = " ".join(fn.__doc__.split())
        assert "default timeout is None" in doc and "PoolExhausted" in doc, fn
    pool = kpool.BufferPool(64, capacity=1)
    objs = kpool.ObjectPool(object, capacity=1)
    held, o = pool.acquire(), objs.get()
    t0 = time.monotonic()
    with pytest.raises(kpool.PoolExhausted):
        pool.acquire()
    with pytest.raises(kpool.PoolExhausted):
        objs.get()
    assert time.monotonic() - t0 < 0.5       # no wait at all
    held.release()
    objs.put(o)


def test_types_are_named_for_the_package():
    for t in (kpool.Block, kpool.BufferPool, kpool.Arena, kpool.ObjectPool):
        assert t.__module__ == "kpool"


def test_block_cannot_be_constructed_directly():
    with pytest.raises(TypeError):
        kpool.Block()


def test_docstrings_visible_to_help():
    for obj in (kpool.malloc, kpool.stats, kpool.stats_reset, kpool.trim, kpool.thread_flush, kpool.stress,
                kpool.Block, kpool.Block.release, kpool.BufferPool, kpool.BufferPool.acquire,
                kpool.BufferPool.release, kpool.BufferPool.stats, kpool.BufferPool.close, kpool.Arena,
                kpool.Arena.alloc, kpool.Arena.reset, kpool.ObjectPool, kpool.ObjectPool.get, kpool.ObjectPool.put,
                kpool.get_include, kpool.get_library, kpool.stats_array):
        assert obj.__doc__ and len(obj.__doc__) > 20, obj
    import inspect

    assert "size" in str(inspect.signature(kpool.malloc))
    assert "timeout" in str(inspect.signature(kpool.BufferPool.acquire))


def test_stub_file_and_py_typed_are_installed():
    pkg = os.path.dirname(kpool.__file__)
    assert os.path.isfile(os.path.join(pkg, "py.typed"))
    stub = os.path.join(pkg, "_core.pyi")
    assert os.path.isfile(stub)
    with open(stub) as f:
        text = f.read()
    for name in ("class Block", "class BufferPool", "class Arena", "def malloc", "def stats", "def stress",
                 "class PoolExhausted"):
        assert name in text
    compile(text, stub, "exec")


def _stub_functions():
    """name -> ast.FunctionDef of the module-level functions in _core.pyi."""
    import ast

    with open(os.path.join(os.path.dirname(kpool.__file__), "_core.pyi")) as f:
        tree = ast.parse(f.read())
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


@pytest.mark.parametrize("name", ["malloc", "stress", "stress_cancel", "stats", "trim"])
def test_stub_signatures_match_the_docstrings(name):
    """Every keyword in the C docstring's signature (what help() and
    inspect show) is in the stub, in the same order, with the same kind and
    default, and the other way round (issue 15: stress's size, burst_bytes)."""
    import ast
    import inspect

    sig = inspect.signature(getattr(kpool, name))
    fn = _stub_functions()[name]
    a = fn.args
    stub = [(p.arg, inspect.Parameter.POSITIONAL_ONLY) for p in a.posonlyargs]
    stub += [(p.arg, inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in a.args]
    stub += [(p.arg, inspect.Parameter.KEYWORD_ONLY) for p in a.kwonlyargs]
    got = [(p.name, p.kind) for p in sig.parameters.values()]
    assert [n for n, _ in got] == [n for n, _ in stub]
    # the stub marks positional-only with "/" only where the C side does; compare keyword-ness
    assert [k == inspect.Parameter.KEYWORD_ONLY for _, k in got] == [k == inspect.Parameter.KEYWORD_ONLY for _, k in stub]
    defaults = dict(zip([p.arg for p in a.args][len(a.args) - len(a.defaults):], a.defaults))
    defaults.update({p.arg: d for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None})
    for p in sig.parameters.values():
        if p.default is not inspect.Parameter.empty:
            assert p.name in defaults, p.name
            assert ast.literal_eval(defaults[p.name]) == p.default, p.name


def test_stress_accepts_every_documented_keyword():
    import inspect

    if not kpool._core.HAVE_STRESS:
        pytest.skip("no stress driver in this build")
    kw = {"threads": 1, "ops": 1000, "allocator": "kpool", "seed": 3, "verify": True, "size": 48,
          "burst_bytes": 1 << 20, "duration": 30.0, "cancel": None}
    assert set(kw) | {"workload"} == set(inspect.signature(kpool.stress).parameters)
    r = kpool.stress("pairs", **kw)
    assert r["size"] == 48 and r["seed"] == 3 and r["duration"] == 30.0


def test_import_needs_only_the_standard_library():
    """import kpool pulls in no third-party module (numpy, cffi, ...)."""
    proc = run_python(
        """
        import sys
        before = set(sys.modules)
        import kpool
        new = {m.split('.')[0] for m in set(sys.modules) - before}
        third = sorted(m for m in new if m not in sys.stdlib_module_names and m not in ('kpool', '_distutils_hack'))
        print(third)
        """ if sys.version_info >= (3, 10) else
        """
        import sys
        import kpool
        print([m for m in ('numpy', 'cffi', 'tqdm', 'matplotlib') if m in sys.modules])
        """)
    assert proc.stdout.strip() == "[]"


def test_bench_is_reachable_when_present():
    here = os.path.dirname(kpool.__file__)
    if not os.path.exists(os.path.join(here, "bench.py")):
        with pytest.raises(AttributeError):
            kpool.bench  # noqa: B018
        return
    proc = run_python("import kpool; m = kpool.bench; print(m.__name__)")
    assert proc.stdout.strip() == "kpool.bench"


def test_unknown_attribute_raises_attribute_error():
    with pytest.raises(AttributeError):
        kpool.no_such_thing  # noqa: B018


def test_help_shows_the_public_api_only():
    """Issue 15: help(kpool) listed the internal alias _core_module (as a
    submodule) and pointed at DESIGN.md, which is not shipped."""
    import pydoc

    text = pydoc.render_doc(kpool, renderer=pydoc.plaintext)
    assert "_core_module" not in text and "SUBMODULES" not in text
    assert "DESIGN.md" not in text
    assert not hasattr(kpool, "_core_module")
    # (pytest's assertion rewriting adds '@py_builtins' and '@pytest_ar' to the package of a pytest11
    # plugin, and kpool.pytest_plugin is an attribute once pytest has loaded it)
    names = {n for n in dir(kpool) if n.isidentifier() and not n.startswith("_")} - {"pytest_plugin"}
    assert names == set(kpool.__all__) - {"__version__"} | {"bench"}
    functions = text[text.index("\nFUNCTIONS\n"):text.index("\nDATA\n")]
    listed = {line.split("(")[0].strip() for line in functions.splitlines() if line.startswith("    ")
              and not line.startswith("     ") and "(" in line}
    assert listed <= set(kpool.__all__), listed
    # the package folder also holds the C library; the docstring says what it is
    contents = text[text.index("PACKAGE CONTENTS"):text.index("CLASSES")].split()[2:]
    assert {c for c in contents if not c.startswith("_")} <= {"bench", "libkpool", "libkpool-malloc",
                                                              "pytest_plugin"}, contents
    assert "not a Python module" in " ".join(kpool.__doc__.split())
    assert "kpool.pytest_plugin" in kpool.__doc__


def test_docstrings_name_no_missing_files():
    """No docstring (nor any source of the package or the binding) points at DESIGN.md."""
    import glob
    import pydoc

    root = os.path.join(os.path.dirname(__file__), os.pardir)
    files = glob.glob(os.path.join(root, "kpool", "*.py")) + glob.glob(os.path.join(root, "kpool", "*.pyi")) \
        + glob.glob(os.path.join(root, "csrc", "python", "*.[ch]"))
    for path in files:
        with open(path) as f:
            assert "DESIGN.md" not in f.read(), path
    for mod in (kpool, kpool.bench):
        assert "DESIGN.md" not in pydoc.render_doc(mod, renderer=pydoc.plaintext)


STRESS_KEYWORDS = ["workload", "threads", "ops", "allocator", "seed", "verify", "size", "burst_bytes", "duration",
                   "cancel"]


def test_stress_signature_and_docstring_cover_every_keyword():
    """Issue 15: stress()'s signature and docstring left out size and
    burst_bytes, and did not say its defaults differ from kpool-stress's."""
    import inspect

    sig = inspect.signature(kpool.stress)
    assert list(sig.parameters) == STRESS_KEYWORDS
    assert sig.parameters["workload"].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    assert all(sig.parameters[k].kind is inspect.Parameter.KEYWORD_ONLY for k in STRESS_KEYWORDS[1:])
    doc = kpool.stress.__doc__
    for k in STRESS_KEYWORDS:
        assert "%s=%r" % (k, sig.parameters[k].default) in doc, k
    flat = " ".join(doc.split())
    assert "kpool-stress" in flat and "1 thread with verify off" in flat
    # every keyword of the signature is accepted, with its documented default
    if kpool._core.HAVE_STRESS:
        r = kpool.stress(workload="pairs", threads=1, ops=2000, allocator="kpool", seed=3, verify=True, size=48,
                         burst_bytes=1 << 20)
        assert r["ops"] == 2000 and r["corrupt"] == 0
        defaults = {k: p.default for k, p in sig.parameters.items()}
        r = kpool.stress(**dict(defaults, workload="pairs", ops=2000))
        assert r["corrupt"] == 0
    with pytest.raises(TypeError):
        kpool.stress(workload="pairs", bogus=1)


def test_stress_stub_matches_the_runtime_signature():
    import ast
    import inspect

    with open(os.path.join(os.path.dirname(kpool.__file__), "_core.pyi")) as f:
        tree = ast.parse(f.read())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "stress")
    stub = [a.arg for a in fn.args.args] + [a.arg for a in fn.args.kwonlyargs]
    assert stub == STRESS_KEYWORDS
    sig = inspect.signature(kpool.stress)
    stub_defaults = dict(zip([a.arg for a in fn.args.args][-len(fn.args.defaults):], fn.args.defaults))
    stub_defaults.update({a.arg: d for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults)})
    for k in STRESS_KEYWORDS:
        assert ast.literal_eval(stub_defaults[k]) == sig.parameters[k].default, k
    assert [a.arg for a in fn.args.args] == ["workload"]


CSRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "csrc")


def test_gil_declarations():
    """kpool._core declares Py_MOD_GIL_NOT_USED in a free-threaded build
    (Py_GIL_DISABLED) and Py_MOD_GIL_USED otherwise (csrc/python/kpy.h:
    Block, BufferPool and Arena guard their own state); kpool._numpy
    declares that it needs no GIL."""
    import re

    root = os.path.join(CSRC, "python")
    with open(os.path.join(root, "module.c")) as f:
        core = f.read()
    with open(os.path.join(root, "numpy_handler.c")) as f:
        numpy_c = f.read()
    slot = re.search(r"#ifdef Py_mod_gil\s*#ifdef Py_GIL_DISABLED\s*(/\*.*?\*/\s*)?"
                     r"\{Py_mod_gil, Py_MOD_GIL_NOT_USED\},\s*#else\s*(/\*.*?\*/\s*)?"
                     r"\{Py_mod_gil, Py_MOD_GIL_USED\},\s*#endif\s*#endif", core, re.S)
    assert slot, "module_slots: NOT_USED under Py_GIL_DISABLED, USED otherwise"
    assert core.count("Py_MOD_GIL_NOT_USED") == 1 and core.count("Py_MOD_GIL_USED}") == 1
    assert "{Py_mod_gil, Py_MOD_GIL_NOT_USED}" in numpy_c


def test_ft_mode_says_how_the_state_is_guarded():
    """kpool._core._FT_MODE: 'gil' in a GIL build, 'free-threaded' under
    Py_GIL_DISABLED (the test builds of make -C csrc pytsan say 'emulated'
    and 'emulated-unlocked': tests/stress/nogil_races.py --expect-mode)."""
    import sysconfig

    want = "free-threaded" if sysconfig.get_config_var("Py_GIL_DISABLED") else "gil"
    assert kpool._core._FT_MODE == want


def test_free_threaded_python_keeps_the_gil_off():
    """On a free-threaded CPython (3.13t): importing kpool (kpool._core) and
    loading kpool._numpy leave the GIL off."""
    import sysconfig

    if not sysconfig.get_config_var("Py_GIL_DISABLED"):
        pytest.skip("not a free-threaded CPython")
    proc = run_python(
        """
        import sys, warnings
        warnings.simplefilter("ignore")
        import kpool
        try:
            kpool.numpy_handler()
        except ImportError:
            pass
        print(sys._is_gil_enabled(), kpool._core._FT_MODE)
        """, env={"PYTHON_GIL": ""})
    assert proc.stdout.split() == ["False", "free-threaded"]


def _python_include_dirs():
    """Python.h folders to compile the binding against: this interpreter's,
    any CPython >= 3.13's found under pyenv or /usr(/local)/include, and the
    folders in KPOOL_FT_INCLUDE (os.pathsep-separated)."""
    import glob
    import sysconfig

    dirs = [sysconfig.get_paths()["include"]]
    pattern = os.path.join("python3.1[3-9]*", "Python.h")
    for base in [os.path.expanduser("~/.pyenv/versions/*/include"), "/usr/include", "/usr/local/include"]:
        dirs += sorted(os.path.dirname(h) for h in glob.glob(os.path.join(base, pattern)))
    dirs += [d for d in os.environ.get("KPOOL_FT_INCLUDE", "").split(os.pathsep) if d]
    seen = []
    for d in dirs:
        if os.path.isfile(os.path.join(d, "Python.h")) and os.path.realpath(d) not in map(os.path.realpath, seen):
            seen.append(d)
    return seen


@pytest.mark.parametrize("define", ["Py_GIL_DISABLED", "KPY_NOGIL_EMULATE"])
@pytest.mark.parametrize("include", _python_include_dirs(), ids=os.path.basename)
def test_binding_compiles_without_the_gil(include, define, tmp_path):
    """The binding's free-threaded code (KPY_FT) compiles warning-free
    (-Wall -Wextra -Werror) with Py_GIL_DISABLED defined against each
    CPython's headers found (a 3.13's too, whose headers then lay out objects
    as a free-threaded build does), and as the KPY_NOGIL_EMULATE test build."""
    import shutil

    if not os.path.isdir(CSRC):
        pytest.skip("needs the source tree's csrc/")
    cc = os.environ.get("CC", "gcc").split()
    if not shutil.which(cc[0]):
        pytest.skip("no C compiler")
    for name in ["module.c", "block.c", "bufferpool.c", "arena.c"]:
        cmd = cc + ["-std=c11", "-D_GNU_SOURCE", "-D" + define, "-DKPOOL_HAVE_STRESS", "-O2", "-fPIC",
                    "-Wall", "-Wextra", "-Werror", "-Wno-missing-field-initializers", "-Wno-unused-parameter",
                    "-I", include, "-I", os.path.join(CSRC, "include"), "-I", os.path.join(CSRC, "stress"),
                    "-I", os.path.join(CSRC, "python"), "-c", os.path.join(CSRC, "python", name),
                    "-o", str(tmp_path / (name + ".o"))]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        assert proc.returncode == 0, "%s\n%s" % (" ".join(cmd), proc.stderr[-4000:])
