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
