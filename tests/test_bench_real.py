"""python -m kpool bench --real: the real-program benchmark runs each
program under every allocator present, checks its output against glibc's,
and prints time and peak RSS tables."""
import json
import subprocess
import sys

import pytest

from conftest import KPOOL_PARENT

bench_real = pytest.importorskip("kpool._bench_real")


def test_quick_run_measures_every_allocator_and_checks_output(tmp_path):
    res = bench_real.run(["json", "sqlite"], ["glibc", "kpool"], rounds=2, quick=True, progress=False)
    recs = res["records"]
    assert {(r["workload"], r["allocator"], r["round"]) for r in recs} == {
        (w, a, k) for w in res["meta"]["workloads"] for a in ("glibc", "kpool") for k in range(2)}
    for r in recs:
        assert not r.get("error"), r
        assert r["seconds"] > 0 and r["peak_rss"] > 1e6
    # interleaved: the allocator order rotates between rounds
    firsts = [next(r["allocator"] for r in recs if r["round"] == k) for k in range(2)]
    assert firsts == ["glibc", "kpool"]
    kp = [r for r in recs if r["allocator"] == "kpool"]
    assert all(r["library"].endswith("libkpool-malloc.so") for r in kp)
    text = bench_real.table(res)
    assert "json" in text and "sqlite" in text and "peak RSS" in text
    bench_real.save(res, tmp_path / "sub" / "real.json")
    assert json.loads((tmp_path / "sub" / "real.json").read_text())["meta"]["kind"] == "real"


def test_a_differing_output_is_an_error():
    res = bench_real.run(["json"], ["glibc", "kpool"], rounds=1, quick=True, progress=False)
    ref = next(r for r in res["records"] if r["allocator"] == "glibc")
    other = next(r for r in res["records"] if r["allocator"] == "kpool")
    assert ref["stdout_sha"] == other["stdout_sha"] and not other.get("error")
    other["stdout_sha"] = "0" * 64                 # as if kpool's run had printed something else
    bench_real.check_outputs(res["records"])
    assert other["error"] == "output differs from glibc's" and not ref.get("error")
    assert "json under kpool, round 0: output differs" in bench_real.table(res)


def test_cli_lists_and_rejects_bad_arguments():
    env_cmd = [sys.executable, "-m", "kpool", "bench", "--real"]
    env = {"PYTHONPATH": KPOOL_PARENT, "PATH": "/usr/bin:/bin"}
    r = subprocess.run(env_cmd + ["--list"], capture_output=True, text=True, env=env, cwd="/")
    assert r.returncode == 0 and "json" in r.stdout and "git-log" in r.stdout
    r = subprocess.run(env_cmd + ["--workloads", "nope"], capture_output=True, text=True, env=env, cwd="/")
    assert r.returncode == 2 and "unknown workload" in r.stderr
    r = subprocess.run(env_cmd + ["--allocators", "nope"], capture_output=True, text=True, env=env, cwd="/")
    assert r.returncode == 2 and "unknown allocator" in r.stderr


def test_cli_quick_run_prints_both_tables():
    r = subprocess.run([sys.executable, "-m", "kpool", "bench", "--real", "--quick", "--workloads", "sqlite",
                        "--no-progress"], capture_output=True, text=True, env={"PYTHONPATH": KPOOL_PARENT,
                                                                               "PATH": "/usr/bin:/bin"}, cwd="/")
    if "skipped: sqlite" in r.stdout:
        pytest.skip("sqlite3 not installed")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "time, seconds" in r.stdout and "peak RSS, MB" in r.stdout
    assert "kpool vs best" in r.stdout


def test_bench_load_refuses_a_real_program_run(tmp_path):
    """bench.load (and so the notebook's saved_runs) takes only kpool-stress runs."""
    from kpool import bench
    res = bench_real.run(["sqlite"], ["glibc"], rounds=1, quick=True, progress=False)
    bench_real.save(res, tmp_path / "real.json")
    with pytest.raises(ValueError, match="real-program run"):
        bench.load(tmp_path / "real.json")
    assert bench.saved_runs(tmp_path) == []
