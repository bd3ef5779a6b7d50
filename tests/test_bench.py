"""kpool.bench: workloads(), allocators(), run() with interleaved rounds,
the Result conversions (numpy, pandas, markdown, JSON round trip, plot),
compare(), and the command line `python -m kpool bench`."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import kpool
from kpool import bench

OPS = 20000
MAIN = ["pairs", "mixed", "random", "larson", "prodcons"]


@pytest.fixture(scope="module")
def avail():
    return [a for a in bench.allocators() if a.available]


@pytest.fixture(scope="module")
def tiny(avail):
    names = ["system", "kpool", "null"] + [a.name for a in avail if a.kind == "peer"]
    return bench.run(workloads=["pairs", "mixed", "larson"], allocators=names + ["kpool-pool"],
                     threads=[1, 2], ops=OPS, repeat=2)


def test_workloads_are_the_contract():
    ws = bench.workloads()
    assert [str(w) for w in ws] == ["pairs", "mixed", "random", "larson", "prodcons", "burst", "frag"]
    for w in ws:
        assert w.name == w and w["name"] == w and isinstance(w.description, str)
    assert {w.name for w in ws if w.memory} == {"burst", "frag"}


def test_allocators_listed_with_availability():
    al = {a.name: a for a in bench.allocators()}
    assert set(al) == {"system", "jemalloc", "tcmalloc", "mimalloc", "kpool", "kpool-mesh", "kpool-preload",
                       "kpool-pool", "null"}
    for name in ("system", "kpool", "kpool-mesh", "kpool-preload", "kpool-pool", "null"):
        assert al[name].available, al[name].reason
    # kpool-preload: the peers' very binary, its malloc replaced by kpool's (the probe checked it took)
    assert al["kpool-preload"].driver == "system" and al["kpool-preload"].library.endswith("libkpool-malloc.so")
    assert al["kpool-mesh"].driver == "kpool" and al["kpool-mesh"].kind == "kpool"   # the same driver, KPOOL_MESH=1
    for name in ("jemalloc", "tcmalloc", "mimalloc"):
        a = al[name]
        assert a.kind == "peer" and a.driver == "system"
        if a.available:
            assert a.reason is None and Path(a.library).exists()
        else:
            assert isinstance(a.reason, str) and a.reason


def test_missing_peer_is_unavailable_not_faked(monkeypatch):
    monkeypatch.setattr(bench, "_find_lib", lambda fname: None)
    al = {a.name: a for a in bench.allocators()}
    for name, so in (("jemalloc", "libjemalloc.so.2"), ("tcmalloc", "libtcmalloc_minimal.so.4"),
                     ("mimalloc", "libmimalloc.so.2")):
        assert not al[name].available
        assert so in al[name].reason
    res = bench.run(workloads=["pairs"], threads=[1], ops=1000, repeat=1)
    assert {r["allocator"] for r in res.records}.isdisjoint({"jemalloc", "tcmalloc", "mimalloc"})
    assert "jemalloc" in res.meta["unavailable"]
    assert "Not measured: jemalloc" in res.table()


def test_preload_that_does_not_take_is_detected(tmp_path):
    bogus = tmp_path / "libnot-an-allocator.so"
    bogus.write_bytes(b"not an ELF file")
    why = bench._probe_preload(bench.find_stress(), bogus)
    assert why is not None


def test_stress_executable_found():
    exe = bench.find_stress()
    assert exe is not None and exe.is_file()
    out = subprocess.run([str(exe), "--list"], capture_output=True, text=True, check=True)
    lst = json.loads(out.stdout)
    assert lst["workloads"] == [str(w) for w in bench.workloads()]
    assert set(lst["allocators"]) == {"kpool", "kpool-pool", "system", "null"}
    assert subprocess.run([str(exe), "--threads", "0"], capture_output=True).returncode == 2
    assert subprocess.run([str(exe), "--workload", "nope"], capture_output=True).returncode == 2
    assert subprocess.run([str(exe), "--bogus"], capture_output=True).returncode == 2
    out = subprocess.run([str(exe), "--workload", "larson", "--threads", "2", "--ops", "5000", "--verify"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    rec = json.loads(out.stdout)
    assert rec["corrupt"] == 0 and rec["verify"] is True and rec["allocator"] == "kpool"


def test_stress_executable_duration_flag():
    """kpool-stress --duration S stops each measurement after S seconds and
    says so in its JSON (issue 15)."""
    import time

    exe = bench.find_stress()
    t0 = time.monotonic()
    out = subprocess.run([str(exe), "--workload", "mixed", "--threads", "2", "--ops", str(10**9),
                          "--duration", "0.3"], capture_output=True, text=True, timeout=120)
    assert time.monotonic() - t0 < 20
    assert out.returncode == 0, out.stderr
    rec = json.loads(out.stdout)
    assert rec["stopped"] is True and rec["stop_reason"] == "duration"
    assert 0 < rec["ops"] < rec["ops_requested"] == 10**9
    assert rec["duration"] == pytest.approx(0.3)
    for bad in ("0", "-1", "x", "1e20", "nan"):
        assert subprocess.run([str(exe), "--duration", bad], capture_output=True).returncode == 2, bad


def test_tiny_run_records(tiny, avail):
    recs = tiny.records
    assert tiny.rows is recs
    names = {"system", "kpool", "null", "kpool-pool"} | {a.name for a in avail if a.kind == "peer"}
    assert {r["allocator"] for r in recs} == names
    for r in recs:
        assert r["error"] is None, r
        assert r["corrupt"] == 0
        assert r["ops"] == OPS
        assert r["ops_per_sec"] > 0
        assert r["round"] in (0, 1)
    # kpool-pool only for the one-size workload
    assert {r["workload"] for r in recs if r["allocator"] == "kpool-pool"} == {"pairs"}
    # one record per workload x allocator x threads x round
    keys = [(r["workload"], r["allocator"], r["threads"], r["round"]) for r in recs]
    assert len(keys) == len(set(keys))
    # ratio to system within the same round; system is 1
    for r in recs:
        if r["allocator"] == "system":
            assert r["ratio_to_system"] == pytest.approx(1.0)
        else:
            base = [s for s in recs if s["allocator"] == "system" and s["workload"] == r["workload"]
                    and s["threads"] == r["threads"] and s["round"] == r["round"]][0]
            assert r["ratio_to_system"] == pytest.approx(r["ops_per_sec"] / base["ops_per_sec"])
    # peers really ran under their preload
    for r in recs:
        a = next(a for a in avail if a.name == r["allocator"])
        if a.kind == "peer":
            assert os.path.realpath(r["malloc_library"]) == os.path.realpath(a.library)
            assert r["command"].startswith("LD_PRELOAD=")
        else:
            assert "LD_PRELOAD" not in r["command"]


def test_rotating_order(tiny):
    def order(rnd):
        rs = [r for r in tiny.records if r["workload"] == "mixed" and r["threads"] == 1 and r["round"] == rnd]
        return [r["allocator"] for r in sorted(rs, key=lambda r: r["order"])]
    o0, o1 = order(0), order(1)
    assert sorted(o0) == sorted(o1)
    assert o1 == o0[1:] + o0[:1]


def test_to_numpy(tiny):
    np = pytest.importorskip("numpy")
    arr = tiny.to_numpy()
    assert isinstance(arr, np.ndarray) and len(arr) == len(tiny.records)
    for f in ("workload", "allocator", "threads", "round", "ops", "seconds", "ops_per_sec", "p50_ns", "p99_ns",
              "p999_ns", "max_ns", "peak_rss", "final_rss", "ratio_to_system"):
        assert f in arr.dtype.names
    assert set(arr["allocator"]) >= {"system", "kpool", "null"}
    assert (arr["ops"] == OPS).all()
    assert (arr["ops_per_sec"] > 0).all()
    sysrows = arr[arr["allocator"] == "system"]
    assert np.allclose(sysrows["ratio_to_system"], 1.0)


def test_to_pandas(tiny):
    pytest.importorskip("pandas")
    df = tiny.to_pandas()
    assert len(df) == len(tiny.records)
    assert {"workload", "allocator", "threads", "round", "ops_per_sec"} <= set(df.columns)


def test_summary_and_table(tiny):
    summ = tiny.summary()
    assert {(s["workload"], s["threads"], s["allocator"]) for s in summ} == {
        (r["workload"], r["threads"], r["allocator"]) for r in tiny.records}
    for s in summ:
        assert s["rounds"] == 2 and s["ok"] == 2
        assert s["mops_min"] <= s["mops_median"] <= s["mops_max"]
    text = tiny.table()
    assert "| workload | threads | allocator | Mops/s |" in text
    assert "| pairs | 1 | kpool |" in text
    assert "x system" in text
    assert "null allocator" in text


def _rec(w, t, a, rnd, **kw):
    r = {"workload": w, "threads": t, "allocator": a, "round": rnd, "error": None, "corrupt": 0}
    r.update(kw)
    return r


def test_targets_pair_rounds_with_the_best_peer():
    recs = []
    for rnd, (k, tc, mi, z) in enumerate([(30e6, 20e6, 10e6, 100e6), (40e6, 25e6, 12e6, 100e6),
                                          (10e6, 20e6, 30e6, 100e6)]):
        for a, v in (("kpool", k), ("tcmalloc", tc), ("mimalloc", mi), ("null", z), ("system", 5e6)):
            recs.append(_rec("mixed", 1, a, rnd, ops_per_sec=v, ns_per_op=1e9 / v,
                             peak_rss={"kpool": 3e6, "system": 2e6}.get(a, 4e6),
                             p999_ns={"kpool": 100, "mimalloc": 90}.get(a, 500), max_ns=1000))
    res = bench.Result(recs, {"machine": {"cores": 2}})
    rows = {r["target"]: r for r in res.targets()}
    speed = rows["mixed, 1 thread: >= 1.25x best peer"]
    # best peer by median is tcmalloc (20M); kpool / tcmalloc per round: 1.5, 1.6, 0.5
    assert speed["ratio_median"] == pytest.approx(1.5)
    assert (speed["ratio_min"], speed["ratio_max"]) == (pytest.approx(0.5), pytest.approx(1.6))
    assert speed["met"] is True
    # net of the null driver (10 ns/op): round 0 tcmalloc 40 ns, kpool 23.3 ns
    assert speed["net_median"] == pytest.approx((50 - 10) / (33.333333 - 10), rel=1e-3)
    mem = rows["peak RSS, mixed 1 thread: <= 1.1x lowest peer (ratio: kpool / peer)"]
    assert mem["ratio_median"] == pytest.approx(1.5) and mem["met"] is False and "system" in mem["measured"]
    lat = rows["latency, mixed 1 thread: p99.9 <= best peer's (ratio: kpool / peer)"]
    assert lat["ratio_median"] == pytest.approx(100 / 90) and lat["met"] is False
    text = res.targets_table()
    assert "| mixed, 1 thread: >= 1.25x best peer | kpool " in text and "| yes |" in text and "| no |" in text


def test_oversubscribed_label():
    n = (os.cpu_count() or 1) + 1
    res = bench.run(workloads=["pairs"], allocators=["system", "kpool"], threads=[n], ops=2000, repeat=1)
    assert f"| {n} (oversubscribed) |" in res.table()


def test_save_load_round_trip(tiny, tmp_path):
    p = tmp_path / "run.json"
    tiny.save(p)
    data = json.loads(p.read_text())
    m = data["meta"]["machine"]
    for k in ("cpu", "cores", "kernel", "python", "kpool", "date"):
        assert m.get(k) is not None, k
    assert data["meta"]["command"]
    assert "libraries" in data["meta"]
    back = bench.load(p)
    assert isinstance(back, bench.Result)
    assert back.records == json.loads(json.dumps(tiny.records))
    assert back.table() == tiny.table()
    assert "|" in bench.compare(tiny, back)
    assert "|" in bench.compare(p, p)


def test_plot(tiny, tmp_path):
    pytest.importorskip("matplotlib")
    p = tmp_path / "run.png"
    tiny.plot(p)
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_creates_missing_folders(tiny, tmp_path):
    """Issue 15: plot() creates the folders of its path, as save() does."""
    pytest.importorskip("matplotlib")
    p = tmp_path / "new" / "dir" / "x.png"
    tiny.plot(p)
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_plot_into_a_new_folder(tiny, tmp_path):
    """`--plot newdir/x.png` printed the tables, then died with FileNotFoundError."""
    pytest.importorskip("matplotlib")
    run = tiny.save(tmp_path / "run.json")
    png = tmp_path / "newdir" / "sub" / "x.png"
    out = _cli("--load", str(run), "--plot", str(png))
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plot: {png}" in out.stdout


def test_cli_unreadable_run_is_one_clean_error(tmp_path):
    """`--load /missing.json` (or --compare, or a file that is not a run) is
    one error line and exit status 2, as argparse errors are; no traceback."""
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    missing = tmp_path / "missing.json"
    for args, name in ((["--load", str(missing)], missing), (["--load", "/missing.json"], "/missing.json"),
                       (["--load", str(bad)], bad), (["--compare", str(missing), "--workloads", "pairs"], missing)):
        out = _cli(*args, "--no-progress")
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert "Traceback" not in out.stderr, out.stderr
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"kpool bench: cannot read {name}: "), out.stderr
        assert out.stdout == ""              # failed before printing (or running) anything
    assert "No such file or directory" in _cli("--load", str(missing)).stderr


@pytest.mark.parametrize("content, why", [
    ('{"records": [1]}', "not a list of measurements"),
    ('[1, 2]', "not a list of measurements"),
    ('{"records": {"a": 1}}', "not a list of measurements"),
    ('{"records": [{"workload": "pairs", "threads": "x"}]}', "not a list of measurements"),
    ('{"records": [], "meta": {"machine": "x"}}', "meta is not"),
    ('{"format": "kpool-bench", "version": 99, "records": []}', "format version 99"),
])
def test_malformed_runs_are_value_errors_and_clean_cli_errors(tmp_path, content, why):
    """JSON that is not a run used to crash load() (and --load, --compare,
    saved_runs and the notebook) with AttributeError, or to load version 99
    as if it were 1."""
    path = tmp_path / "x.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=why):
        bench.load(path)
    assert bench.saved_runs(tmp_path) == []            # skipped, as the docstring says
    out = _cli("--load", str(path))
    assert out.returncode == 2 and "Traceback" not in out.stderr and why in out.stderr, out.stderr


def test_repeated_names_are_measured_once_and_bad_plans_refused():
    """`--threads 1,1` used to count as two rounds, with the system
    baseline of the round being whichever duplicate came last."""
    res = bench.run(workloads=["pairs", "pairs"], allocators=["system", "null", "system"], threads=[1, 1],
                    ops=OPS, repeat=1)
    assert len(res.records) == 2 and res.meta["params"]["threads"] == [1]
    assert {s["allocator"]: s["rounds"] for s in res.summary()} == {"system": 1, "null": 1}
    system = [s for s in res.summary() if s["allocator"] == "system"][0]
    assert system["ratio_median"] == 1.0
    base = dict(workloads=["pairs"], allocators=["null"], ops=100, repeat=1)
    for bad, why in ((dict(workloads=[]), "no workloads"), (dict(allocators=[]), "no allocators"),
                     (dict(threads=[5000]), "1..4096"), (dict(ops=1 << 64), "2\\*\\*64"),
                     (dict(size=0), "size must be >= 1"), (dict(burst_bytes=0), "burst_bytes"),
                     (dict(repeat=10**9), "1..100000"),
                     (dict(allocators=["kpool-pool"], workloads=["mixed"]), "nothing to run"),
                     (dict(allocators=["null"], workloads=["burst"]), "nothing to run")):
        with pytest.raises(ValueError, match=why):
            bench.run(**{**base, **bad})


def test_cli_argument_errors_are_exit_2_without_a_traceback(tmp_path):
    for args, why in ((["--threads", "x"], "comma list of integers"), (["--threads", "1.5"], "comma list of integers"),
                      (["--workloads", ""], "no workloads"), (["--allocators", ""], "no allocators"),
                      (["--threads", "5000"], "1..4096"), (["--quick", "--rounds", "0"], "repeat"),
                      (["--quick", "--ops", "0"], "ops must be"),
                      (["--plot", str(tmp_path / "out.xyz")], "ending in .png")):
        out = _cli(*args, "--no-progress", "--workloads" if "--workloads" not in args else "--seed",
                   "pairs" if "--workloads" not in args else "1")
        assert out.returncode == 2, (args, out.stdout[-500:], out.stderr[-500:])
        assert "Traceback" not in out.stderr and why in out.stderr, (args, out.stderr)


def test_compare_of_runs_with_nothing_in_common_says_so():
    a = bench.run(workloads=["pairs"], allocators=["null"], threads=[1], ops=OPS, repeat=1)
    b = bench.run(workloads=["mixed"], allocators=["null"], threads=[2], ops=OPS, repeat=1)
    assert "nothing to compare" in bench.compare(a, b)
    assert "nothing to compare" not in bench.compare(a, a)


def test_to_numpy_marks_failed_measurements():
    np = pytest.importorskip("numpy")
    res = bench.Result([
        {"workload": "pairs", "allocator": "kpool", "threads": 1, "round": 0, "ops_per_sec": 2e6, "error": None},
        {"workload": "pairs", "allocator": "kpool", "threads": 1, "round": 1, "ops_per_sec": 9e9, "corrupt": 5},
        {"workload": "pairs", "allocator": "kpool", "threads": 1, "round": 2, "ops_per_sec": 8e9, "error": "x"},
    ], {})
    arr = res.to_numpy()
    assert arr["ok"].tolist() == [True, False, False]
    assert np.median(arr[arr["ok"]]["ops_per_sec"]) == res.summary()[0]["mops_median"] * 1e6 == 2e6


def test_memory_workloads():
    res = bench.run(workloads=["burst", "frag"], allocators=["system", "kpool"], ops={"frag": OPS}, repeat=1,
                    burst_bytes=4 << 20)
    recs = {(r["workload"], r["allocator"]): r for r in res.records}
    assert set(recs) == {("burst", "system"), ("burst", "kpool"), ("frag", "system"), ("frag", "kpool")}
    for r in recs.values():
        assert r["error"] is None and r["corrupt"] == 0
    b = recs[("burst", "kpool")]
    assert b["rss_full"] > 0 and b["rss_after_1s"] is not None and b["trim"] == "kp_trim"
    assert recs[("burst", "system")]["trim"] == "malloc_trim"
    assert recs[("frag", "kpool")]["frag_ratio_refill"] > 0
    text = res.table()
    assert "Burst:" in text and "Frag:" in text


def test_frag_kpool_mesh_gives_memory_back_on_trim():
    """kpool-mesh is kpool under KPOOL_MESH=1: its trim meshes the sparse
    spans frag leaves, plain kpool's cannot; every allocator reports its trim."""
    res = bench.run(workloads=["frag"], allocators=["system", "kpool", "kpool-mesh"], ops={"frag": 200_000},
                    repeat=1)
    recs = {r["allocator"]: r for r in res.records}
    for r in recs.values():
        assert r["error"] is None and r["corrupt"] == 0 and r["frag_ratio_trim"] > 0
    assert recs["kpool-mesh"]["command"].startswith("KPOOL_MESH=1 ")
    assert "KPOOL_MESH" not in recs["kpool"]["command"]
    assert recs["kpool"]["frag_trim"] == recs["kpool-mesh"]["frag_trim"] == "kp_trim"
    assert recs["system"]["frag_trim"] == "malloc_trim"
    assert recs["kpool-mesh"]["frag_ratio_trim"] < 0.8 * recs["kpool"]["frag_ratio_trim"]
    assert "after trim" in res.table()


def test_bad_arguments():
    with pytest.raises(ValueError):
        bench.run(workloads=["nope"], ops=100, repeat=1)
    with pytest.raises(ValueError):
        bench.run(workloads=["pairs"], allocators=["nope"], ops=100, repeat=1)
    with pytest.raises(ValueError):
        bench.run(workloads=["pairs"], allocators=["system"], ops=100, repeat=0)
    with pytest.raises(ValueError):
        bench.run(workloads=["pairs"], allocators=["system"], ops=100, threads=[0], repeat=1)
    # floats and strings are not truncated or parsed (threads=[1.9] used to run 1 thread)
    base = dict(workloads=["pairs"], allocators=["null"], ops=100, repeat=1)
    for bad in (dict(threads=[1.9]), dict(ops=1000.7), dict(repeat=1.9), dict(repeat="3"), dict(seed=1.5),
                dict(size=32.0), dict(burst_bytes="1"), dict(ops={"pairs": 10.5})):
        with pytest.raises(TypeError, match="must be an integer"):
            bench.run(**{**base, **bad})
    for bad in (dict(seed=-1), dict(seed=(1 << 64) - 1, repeat=2), dict(size=-1), dict(burst_bytes=-1)):
        with pytest.raises(ValueError):
            bench.run(**{**base, **bad})


def _cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "kpool", "bench", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=os.path.dirname(os.path.abspath(kpool.__file__)) + "/..")


def test_cli_small_run(tmp_path):
    save = tmp_path / "cli.json"
    out = _cli("--workloads", "pairs,mixed", "--threads", "1,2", "--rounds", "2", "--ops", str(OPS),
               "--save", str(save), "--no-progress")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "| pairs | 1 | kpool |" in out.stdout
    assert "command: python -m kpool bench" in out.stdout
    res = bench.load(save)
    assert {r["workload"] for r in res.records} == {"pairs", "mixed"}
    out2 = _cli("--load", str(save), "--compare", str(save))
    assert out2.returncode == 0, out2.stderr[-2000:]
    assert "old Mops/s" in out2.stdout


def test_cli_list_and_errors():
    out = _cli("--list")
    assert out.returncode == 0
    assert "pairs" in out.stdout and "kpool-pool" in out.stdout
    bad = _cli("--workloads", "nope", "--no-progress")
    assert bad.returncode == 2
    assert "unknown workload" in bad.stderr


def test_import_needs_only_stdlib():
    code = ("import sys, importlib.util; "
            "spec = importlib.util.spec_from_file_location('b', sys.argv[1]); m = importlib.util.module_from_spec(spec); "
            "spec.loader.exec_module(m); "
            "bad = [x for x in ('numpy', 'pandas', 'matplotlib', 'tqdm') if x in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code, bench.__file__], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_cli_ctrl_c_saves_the_rounds_measured(tmp_path):
    """Issue 15: Ctrl-C during `python -m kpool bench --save F` after the
    first round saves what was measured, marked partial, prints the table so
    far (no traceback) and exits 130."""
    import re
    import signal
    import threading
    import time

    save = tmp_path / "partial.json"
    proc = subprocess.Popen([sys.executable, "-m", "kpool", "bench", "--workloads", "pairs", "--allocators",
                             "system,kpool", "--threads", "1", "--ops", "2000", "--rounds", "100000",
                             "--save", str(save)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=os.path.dirname(os.path.abspath(kpool.__file__)) + "/..")
    chunks = []

    def read_progress():
        while True:
            c = proc.stderr.read(1)
            if not c:
                return
            chunks.append(c)

    reader = threading.Thread(target=read_progress, daemon=True)
    reader.start()
    # the progress line names each measurement's round as it starts: once
    # round 2 (or later) shows, round 1 is complete
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not re.search(r" r([2-9]|\d\d+)\b", "".join(chunks)):
        time.sleep(0.05)
    assert re.search(r" r([2-9]|\d\d+)\b", "".join(chunks)), "".join(chunks)[-2000:]
    proc.send_signal(signal.SIGINT)
    killer = threading.Timer(60, proc.kill)    # a hang fails the test instead of blocking it
    killer.start()
    out = proc.stdout.read()                   # stderr belongs to the reader thread
    proc.wait()
    killer.cancel()
    reader.join(10)
    stderr = "".join(chunks)
    assert proc.returncode == 130, (proc.returncode, stderr[-2000:])
    assert "Traceback" not in stderr, stderr[-3000:]
    assert "interrupted" in stderr
    assert "PARTIAL" in out and "| pairs | 1 | kpool |" in out, out
    assert f"saved: {save}" in out
    data = json.loads(save.read_text())
    assert data["partial"] is True
    assert data["meta"]["rounds_completed"] >= 1
    assert data["meta"]["measured"] == len(data["records"]) >= 2
    assert data["meta"]["planned"] == 200000
    assert {r["allocator"] for r in data["records"]} == {"system", "kpool"}
    assert all(r["error"] is None and not r.get("stopped") for r in data["records"])
    res = bench.load(save)
    assert res.partial and len(res) == data["meta"]["measured"]


def test_run_interrupted_raises_with_the_partial_result(monkeypatch):
    """The API: Ctrl-C inside run() raises BenchInterrupted, a KeyboardInterrupt
    whose .result holds what was measured before."""
    calls = []
    real = bench._measure

    def measure(*args, **kw):
        if len(calls) == 3:
            raise KeyboardInterrupt
        calls.append(1)
        return real(*args, **kw)

    monkeypatch.setattr(bench, "_measure", measure)
    with pytest.raises(KeyboardInterrupt) as e:
        bench.run(workloads=["pairs"], allocators=["system", "kpool"], threads=[1], ops=1000, repeat=5)
    assert isinstance(e.value, bench.BenchInterrupted)
    res = e.value.result
    assert res.partial and len(res) == 3
    assert res.meta["planned"] == 10 and res.meta["rounds_completed"] == 1
    assert res.to_dict()["partial"] is True
    assert "| pairs | 1 | kpool |" in res.table()
