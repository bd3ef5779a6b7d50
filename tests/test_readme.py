"""README.md: every ```python block runs as written, `python -m kpool`
(the demonstration) exits 0, the ```c block builds and runs, the set-up steps include a virtual
environment, and the benchmark table names the allocators as bench does."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import KPOOL_PARENT, kpool, run_python

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

pytestmark = pytest.mark.skipif(not README.exists(), reason="needs the source tree's README.md")


def python_blocks():
    text = README.read_text() if README.exists() else ""
    return re.findall(r"^```python\n(.*?)^```$", text, flags=re.S | re.M)


def test_readme_has_python_blocks():
    assert len(python_blocks()) >= 3


@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_readme_python_block_runs(index):
    code = python_blocks()[index]
    proc = run_python(code, timeout=300)
    assert "Traceback" not in proc.stderr


def test_python_dash_m_kpool_demo_runs():
    env = dict(os.environ)
    env["PYTHONPATH"] = KPOOL_PARENT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.run([sys.executable, "-m", "kpool"], capture_output=True, text=True, timeout=300, env=env,
                          cwd="/")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("kpool %s" % kpool.__version__)
    assert "malloc(100)" in proc.stdout and "BufferPool(4096)" in proc.stdout and "corrupt 0" in proc.stdout
    help_ = subprocess.run([sys.executable, "-m", "kpool", "--help"], capture_output=True, text=True, timeout=60,
                           env=env, cwd="/")
    assert help_.returncode == 0 and "python -m kpool bench" in help_.stdout


def test_python_dash_m_kpool_unknown_command_exits_2():
    env = dict(os.environ)
    env["PYTHONPATH"] = KPOOL_PARENT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.run([sys.executable, "-m", "kpool", "no-such-command"], capture_output=True, text=True,
                          timeout=60, env=env, cwd="/")
    assert proc.returncode == 2 and "no-such-command" in proc.stderr, proc.stderr


def test_setup_makes_a_virtual_environment_first():
    text = README.read_text()
    setup = text[text.index("## Set up"):text.index("## A short tour")]
    venv = setup.index("python3 -m venv .venv && . .venv/bin/activate")
    assert venv < setup.index("pip install '.[bench]'") and venv < setup.index("pip install '.[test]'")


def test_benchmark_table_names_allocators_as_bench_does():
    from kpool import bench

    text = README.read_text()
    headers = [line for line in text.splitlines() if line.startswith("| workload | threads |")]
    assert headers
    for line in headers:
        cells = [c.strip() for c in line.strip("|").split("|")][2:]
        assert cells and set(cells) <= set(bench.ALLOCATORS), cells
    assert "x system" in bench.Result([{"workload": "pairs", "threads": 1, "allocator": "system", "round": 0,
                                        "ops_per_sec": 1e6, "error": None, "corrupt": 0}], {}).table()


def test_to_pandas_comes_with_the_bench_extra():
    pyproject = (ROOT / "pyproject.toml").read_text()
    bench_extra = re.search(r"^bench = \[(.*)\]$", pyproject, flags=re.M).group(1)
    assert '"pandas"' in bench_extra


def test_readme_c_block_compiles_and_runs(tmp_path):
    """README's ```c block, inside a main(), built against get_include() and
    get_library() with -Wall -Wextra -Werror, runs and exits 0."""
    import shutil

    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    blocks = re.findall(r"^```c\n(.*?)^```$", README.read_text(), flags=re.S | re.M)
    assert len(blocks) == 1
    src = tmp_path / "readme.c"
    src.write_text("#include <kpool.h>\n\nint main(void) {\n" + blocks[0] +
                   "    kp_pool_destroy(pool);\n    return st.allocs >= 1 ? 0 : 1;\n}\n")
    exe = tmp_path / "readme"
    libdir = os.path.dirname(kpool.get_library())
    subprocess.run([cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-I", kpool.get_include(), str(src), "-o",
                    str(exe), os.path.join(libdir, "libkpool.so"), "-Wl,-rpath," + libdir], check=True)
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
