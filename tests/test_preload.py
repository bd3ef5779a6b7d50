"""kpool as a whole program's malloc (libkpool-malloc.so): real programs run
under it with output identical to glibc's, the calls reach kpool, and
``python -m kpool run`` / ``kpool.run`` behave as documented."""
import hashlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

from conftest import KPOOL_PARENT, kpool

LIB = kpool.get_preload()
EXPORTED = {
    "malloc", "free", "calloc", "realloc", "reallocarray", "memalign", "posix_memalign", "aligned_alloc",
    "valloc", "pvalloc", "malloc_usable_size", "free_sized", "free_aligned_sized", "malloc_trim",
    "mallinfo", "mallinfo2", "malloc_stats",
}


def allocs_of(stderr):
    """kpool's alloc count from a KPOOL_STATS=1 report."""
    m = re.search(r"^allocs (\d+), frees (\d+)", stderr, re.M)
    assert m, stderr[-2000:]
    return int(m.group(1))


def both(args, **kwargs):
    """Run args plainly and under kpool's malloc (with its statistics);
    return (plain, kpool) CompletedProcess objects."""
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("timeout", 300)
    env = kwargs.pop("env", None)
    plain = subprocess.run(args, env=env, **kwargs)
    under = kpool.run(args, stats=True, env=env, **kwargs)
    return plain, under


def test_the_library_is_installed_and_exports_only_the_allocation_calls():
    assert os.path.isfile(LIB) and LIB.endswith("libkpool-malloc.so")
    if shutil.which("nm") is None:
        pytest.skip("needs nm")
    out = subprocess.run(["nm", "-D", "--defined-only", LIB], capture_output=True, text=True, check=True).stdout
    names = {line.split()[-1].split("@")[0] for line in out.splitlines() if line.split()[1] in "TWiV"}
    c_names = {n for n in names if not n.startswith("_Z")}
    assert c_names == EXPORTED
    assert {n for n in names if n.startswith("_Z")} >= {"_Znwm", "_ZdlPv", "_ZdlPvm", "_ZnwmSt11align_val_t"}
    assert not any(n.startswith("kp_") or n.startswith("_kp") for n in names)


def test_python_json_and_ast_give_the_same_output():
    code = textwrap.dedent("""
        import ast, hashlib, json, os
        data = [{"id": i, "name": "x" * (i % 50), "tags": list(range(i % 7))} for i in range(60000)]
        text = json.dumps(data, sort_keys=True)
        assert json.loads(text) == data
        src = open(os.path.join(os.path.dirname(json.__file__), "decoder.py")).read()
        dump = ast.dump(ast.parse(src))
        print(hashlib.sha256((text + dump).encode()).hexdigest(), len(text))
    """)
    env = dict(os.environ, PYTHONMALLOC="malloc")
    plain, under = both([sys.executable, "-c", code], env=env, text=True)
    assert plain.returncode == 0 and under.returncode == 0, under.stderr[-3000:]
    assert under.stdout == plain.stdout
    assert allocs_of(under.stderr) > 100000          # the interpreter's objects came from kpool


def test_python_threads_fork_and_subprocesses(tmp_path):
    code = textwrap.dedent("""
        import os, subprocess, sys, threading, concurrent.futures as cf
        def work(n):
            return sum(len(str(list(range(i)))) for i in range(n))
        with cf.ThreadPoolExecutor(8) as ex:
            results = list(ex.map(work, [300] * 32))
        expected = work(200)
        pid = os.fork()
        if pid == 0:                       # the child allocates while the parent's threads are gone
            with cf.ThreadPoolExecutor(4) as ex:
                os._exit(0 if list(ex.map(work, [200] * 8)) == [expected] * 8 else 1)
        _, status = os.waitpid(pid, 0)
        out = subprocess.run([sys.executable, "-c", "print(sum(range(10)))"], capture_output=True, text=True).stdout
        print(results[0], status, out.strip())
    """)
    env = dict(os.environ, PYTHONMALLOC="malloc")
    plain, under = both([sys.executable, "-c", code], env=env, text=True)
    assert under.returncode == 0, under.stderr[-3000:]
    assert under.stdout == plain.stdout


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_commits_logs_and_gc(tmp_path):
    def git_script(repo):
        return textwrap.dedent(f"""
            set -e
            git init -q {repo}
            cd {repo}
            git config user.email t@example.com; git config user.name t
            for i in $(seq 1 40); do
                seq $i 3 $((i * 300)) > file$((i % 7)).txt
                git add -A; git commit -q -m "commit $i" --date "2026-01-01T00:00:$((i % 60))" 
            done
            git log --stat -M --format='%s %T' | sha256sum
            git gc -q --aggressive
            git fsck --full 2>&1 | sha256sum
            git count-objects -v | grep -E '^(count|in-pack)'
        """)
    env = dict(os.environ, GIT_COMMITTER_DATE="2026-01-01T00:00:00", GIT_AUTHOR_DATE="2026-01-01T00:00:00")
    plain = subprocess.run(["bash", "-c", git_script(tmp_path / "a")], env=env, capture_output=True, text=True)
    under = kpool.run(["bash", "-c", git_script(tmp_path / "b")], env=env, capture_output=True, text=True)
    assert plain.returncode == 0, plain.stderr
    assert under.returncode == 0, under.stderr[-3000:]
    assert under.stdout == plain.stdout


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_gcc_builds_byte_identical_objects(tmp_path):
    src = tmp_path / "big.c"
    funcs = "\n".join(f"int f{i}(int x) {{ int s = 0; for (int k = 0; k < x; k++) s += k * {i} ^ (s >> 3); return s; }}"
                      for i in range(2000))
    src.write_text(funcs + "\nint main(void) { return f7(3) & 1; }\n")
    plain = subprocess.run(["gcc", "-O2", "-c", str(src), "-o", str(tmp_path / "plain.o")], capture_output=True)
    under = kpool.run(["gcc", "-O2", "-c", str(src), "-o", str(tmp_path / "kpool.o")], capture_output=True)
    assert plain.returncode == 0 and under.returncode == 0, under.stderr[-2000:]
    digest = [hashlib.sha256((tmp_path / n).read_bytes()).hexdigest() for n in ("plain.o", "kpool.o")]
    assert digest[0] == digest[1]


@pytest.mark.skipif(shutil.which("sqlite3") is None, reason="needs the sqlite3 shell")
def test_sqlite3_rows_indexes_queries(tmp_path):
    def script(db):
        return [
            "sqlite3", str(db),
            "create table t(id integer primary key, k text, v real);"
            "with recursive c(x) as (select 1 union all select x + 1 from c limit 200000)"
            " insert into t(k, v) select printf('key%07d', (x * 7919) % 200000), x * 0.5 from c;"
            "create index tk on t(k); create index tv on t(v);"
            "select count(*), sum(v), min(k), max(k) from t where k like 'key01%';"
            "select k, count(*) from t group by substr(k, 1, 5) order by 2 desc limit 3;"
            "delete from t where id % 3 = 0; vacuum; pragma integrity_check;",
        ]
    plain = subprocess.run(script(tmp_path / "a.db"), capture_output=True, text=True, timeout=300)
    under = kpool.run(script(tmp_path / "b.db"), stats=True, capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0 and under.returncode == 0, under.stderr[-3000:]
    assert under.stdout == plain.stdout and under.stdout.strip().endswith("ok")
    assert allocs_of(under.stderr) > 10000


def test_python_under_the_drop_in_with_meshing_gives_memory_back():
    """A whole CPython on kpool with KPOOL_MESH=1: after it frees 90% of a
    million strings, malloc_trim (kpool's: kp_trim) meshes the sparse spans;
    the proportional RSS falls well below the same run without meshing and
    every surviving string, and a JSON round trip of them, is intact."""
    code = textwrap.dedent("""
        import ctypes, json, random
        random.seed(1)
        objs = [("x" * random.randint(1, 200)) + str(i) for i in range(600_000)]
        keep = [o for o in objs if random.random() < 0.1]
        del objs
        ctypes.CDLL(None).malloc_trim(0)
        with open("/proc/self/smaps_rollup") as f:
            pss = int([line for line in f if line.startswith("Pss:")][0].split()[1])
        random.seed(1)
        again = [("x" * random.randint(1, 200)) + str(i) for i in range(600_000)]
        want = [o for o in again if random.random() < 0.1]
        assert keep == want and json.loads(json.dumps(keep)) == keep
        print(pss)
    """)
    if not os.path.exists("/proc/self/smaps_rollup"):
        pytest.skip("needs /proc/self/smaps_rollup")
    res = {}
    for mesh in ("0", "1"):
        env = dict(os.environ, PYTHONMALLOC="malloc", KPOOL_MESH=mesh)
        r = kpool.run([sys.executable, "-c", code], stats=True, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        res[mesh] = (int(r.stdout.split()[-1]), r.stderr)
    assert re.search(r"^meshing: \d+ spans meshed", res["1"][1], re.M), res["1"][1][-2000:]
    assert "meshing:" not in res["0"][1]
    assert res["1"][0] < 0.75 * res["0"][0], res      # KiB of Pss after the trim


def test_a_crash_under_faulthandler_with_meshing_reports_once():
    """faulthandler installs its handler after kpool's first meshing pass,
    kpool's goes back on top at the next; a real crash must still print one
    report and end the process with SIGSEGV (it once looped, printing
    tracebacks without end)."""
    code = textwrap.dedent("""
        import ctypes, faulthandler, random
        for letter in "xy":
            objs = [letter * random.randint(1, 200) for i in range(300_000)]
            keep = objs[::10]
            del objs
            ctypes.CDLL(None).malloc_trim(0)       # kp_trim: meshes
            faulthandler.enable()
        ctypes.string_at(16)
    """)
    env = dict(os.environ, PYTHONMALLOC="malloc", KPOOL_MESH="1")
    r = kpool.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == -11, (r.returncode, r.stderr[-2000:])
    assert r.stderr.count("Fatal Python error: Segmentation fault") == 1, r.stderr[-2000:]


def test_python_m_kpool_run_passes_the_exit_status_and_prints_stats():
    env = dict(os.environ, PYTHONPATH=KPOOL_PARENT)
    env.pop("KPOOL_STATS", None)
    cmd = [sys.executable, "-m", "kpool", "run"]
    r = subprocess.run(cmd + ["--", sys.executable, "-c", "import sys; print('hi'); sys.exit(3)"],
                       capture_output=True, text=True, env=env, cwd="/")
    assert r.returncode == 3 and r.stdout == "hi\n" and "kpool 0.1.0 statistics" not in r.stderr
    r = subprocess.run(cmd + ["--stats", sys.executable, "-c", "pass"], capture_output=True, text=True, env=env, cwd="/")
    assert r.returncode == 0 and "statistics" in r.stderr and "allocs" in r.stderr
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd="/")
    assert r.returncode == 2 and "no command given" in r.stderr
    r = subprocess.run(cmd + ["--", "/nonexistent/program"], capture_output=True, text=True, env=env, cwd="/")
    assert r.returncode == 127 and "cannot run" in r.stderr
    r = subprocess.run(cmd + ["--bogus", "true"], capture_output=True, text=True, env=env, cwd="/")
    assert r.returncode == 2 and "unknown option" in r.stderr
    r = subprocess.run(cmd + ["--", "/etc/hostname"], capture_output=True, text=True, env=env, cwd="/")
    assert r.returncode == 126 and "cannot run" in r.stderr      # there, but not a program: as a shell


def test_python_m_kpool_run_gives_the_command_default_signals():
    """Python ignores SIGPIPE and SIGXFSZ and exec keeps that: `yes | head`
    under `python -m kpool run` printed "Broken pipe" and exited 1."""
    env = dict(os.environ, PYTHONPATH=KPOOL_PARENT)
    r = subprocess.run([sys.executable, "-m", "kpool", "run", "--", "sh", "-c", "grep SigIgn /proc/self/status"],
                       capture_output=True, text=True, env=env, cwd="/")
    ignored = int(r.stdout.split()[1], 16)
    assert r.returncode == 0 and not ignored & (1 << (signal.SIGPIPE - 1)) and not ignored & (1 << (signal.SIGXFSZ - 1))
    r = subprocess.run(f"{shlex.quote(sys.executable)} -m kpool run -- yes | head -1", shell=True,
                       capture_output=True, text=True, env=env, cwd="/")
    assert r.stdout == "y\n" and "Broken pipe" not in r.stderr, r.stderr


def test_kpool_run_keeps_other_preloads_and_rejects_a_bare_string():
    r = kpool.run([sys.executable, "-c", "import os; print(os.environ['LD_PRELOAD'])"],
                  env=dict(os.environ, LD_PRELOAD="/lib/other.so"), capture_output=True, text=True)
    # the other library does not exist: ld.so warns and goes on
    assert r.stdout.split() == [LIB, "/lib/other.so"]
    with pytest.raises(TypeError):
        kpool.run("echo hi")
    assert kpool.run("echo hi", shell=True, capture_output=True, text=True).stdout == "hi\n"


@pytest.mark.skipif(shutil.which("redis-server") is None or shutil.which("redis-cli") is None,
                    reason="needs redis-server and redis-cli")
def test_redis_server_serves_under_kpool(tmp_path):
    import time
    sock = tmp_path / "r.sock"
    server = subprocess.Popen(["redis-server", "--port", "0", "--unixsocket", str(sock), "--save", "",
                               "--appendonly", "no", "--dir", str(tmp_path)],
                              env=kpool._preload.preload_env(), stdout=subprocess.DEVNULL)
    try:
        for _ in range(500):
            if sock.exists():
                break
            time.sleep(0.02)
        cli = ["redis-cli", "-s", str(sock)]
        for i in range(200):
            subprocess.run(cli + ["rpush", "l", "x" * (i * 37 % 3000)], check=True, capture_output=True)
        assert subprocess.run(cli + ["llen", "l"], capture_output=True, text=True).stdout.strip() == "200"
        info = subprocess.run(cli + ["info", "memory"], capture_output=True, text=True).stdout
        assert "used_memory:" in info
        assert server.poll() is None
    finally:
        server.terminate()
        server.wait(timeout=10)
