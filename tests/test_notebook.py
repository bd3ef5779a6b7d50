"""benchmarks/analysis.ipynb runs headless (nbclient) on the small saved run
in benchmarks/runs/, so the analysis cannot rot."""
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "benchmarks" / "analysis.ipynb"
SMALL_RUN = ROOT / "benchmarks" / "runs" / "small.json"

pytestmark = pytest.mark.skipif(not NOTEBOOK.exists(), reason="needs the source tree's benchmarks/")


def test_saved_run_loads():
    from kpool import bench
    res = bench.load(SMALL_RUN)
    assert len(res.records) > 0
    assert res.meta["machine"]["cores"] >= 1
    arr = res.to_numpy() if _has("numpy") else None
    if arr is not None:
        assert len(arr) == len(res.records)
    assert "| workload |" in res.table()


def _has(mod):
    try:
        __import__(mod)
        return True
    except ImportError:
        return False


def test_analysis_notebook_executes(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    pytest.importorskip("numpy")
    pytest.importorskip("matplotlib")
    monkeypatch.setenv("KPOOL_BENCH_RUN", str(SMALL_RUN))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(str(NOTEBOOK), as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    errors = [o for o in outputs if o.get("output_type") == "error"]
    assert not errors, errors[0].get("evalue") if errors else None
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 4
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert "median Mops/s" in text and "small.json" in text


# -- choosing runs by content (issue 15 item 7) ---------------------------------


def _run(date, workloads, threads=(1, 2)):
    from kpool import bench
    recs = [{"workload": w, "threads": t, "allocator": a, "round": 0, "ops_per_sec": 1e6, "error": None,
             "corrupt": 0} for w in workloads for t in threads for a in ("system", "kpool")]
    return bench.Result(recs, {"machine": {"date": date, "cores": 2}})


def test_newest_run_is_chosen_by_its_workloads():
    from kpool import bench
    full = _run("2026-01-01T00:00:00+00:00", bench.WORKLOADS)
    speed_only = _run("2026-02-01T00:00:00+00:00", bench.MAIN_WORKLOADS)
    runs = [full, speed_only]
    assert bench.newest_run(runs, bench.MAIN_WORKLOADS) is speed_only
    assert bench.newest_run(runs, bench.MEMORY_WORKLOADS) is full
    assert bench.newest_run(runs, ["burst", "nope"]) is None


def test_comparable_runs_measured_the_same_workloads():
    from kpool import bench
    a = _run("2026-01-01T00:00:00+00:00", bench.WORKLOADS, threads=(1, 2, 8))
    b = _run("2026-01-02T00:00:00+00:00", bench.MAIN_WORKLOADS)
    c = _run("2026-01-03T00:00:00+00:00", bench.WORKLOADS, threads=(1, 2, 8))
    d = _run("2026-01-04T00:00:00+00:00", bench.MAIN_WORKLOADS, threads=(1, 2, 8))   # other threads than b
    assert bench.comparable_runs([a, b, c, d]) == (a, c)
    assert bench.comparable_runs([a, b]) is None
    e = _run("2026-01-05T00:00:00+00:00", bench.MAIN_WORKLOADS)
    assert bench.comparable_runs([a, b, c, d, e]) == (b, e)


def test_saved_runs_are_ordered_by_their_recorded_date_not_file_time(tmp_path):
    from kpool import bench
    runs = ROOT / "benchmarks" / "runs"
    names = ["small.json", "targets-2cores-v3.json", "default-2cores-v4.json"]
    for i, n in enumerate(names):
        dst = tmp_path / n
        dst.write_bytes((runs / n).read_bytes())
        os.utime(dst, (1e9 - i * 1000, 1e9 - i * 1000))     # file times the other way round
    (tmp_path / "notes.json").write_text('{"not": "a run"}')
    got = bench.saved_runs(tmp_path)
    assert [r.path.name for r in got] == ["small.json", "targets-2cores-v3.json", "default-2cores-v4.json"]
    assert [r.date for r in got] == sorted(r.date for r in got)


def _execute(monkeypatch, env):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    pytest.importorskip("numpy")
    pytest.importorskip("matplotlib")
    monkeypatch.delenv("KPOOL_BENCH_RUN", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(str(NOTEBOOK), as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    errors = [o for o in outputs if o.get("output_type") == "error"]
    assert not errors, errors[0].get("evalue") if errors else None
    return nb, "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")


def test_notebook_in_a_fresh_clone_picks_runs_by_content(tmp_path, monkeypatch):
    """The newest file by mtime is a run without burst and frag rows (as can
    happen in a fresh clone): the memory panels still get a run that has
    them, and the comparison sets side by side only runs that measured the
    same workloads."""
    runs = ROOT / "benchmarks" / "runs"
    for i, n in enumerate(["default-2cores-v3.json", "small.json", "targets-2cores-v3.json",
                           "targets-2cores-v4.json"]):
        dst = tmp_path / n
        dst.write_bytes((runs / n).read_bytes())
    os.utime(tmp_path / "small.json", (2e9, 2e9))                 # newest file, oldest run
    os.utime(tmp_path / "targets-2cores-v3.json", (2.1e9, 2.1e9))  # newest file: no burst, no frag
    nb, text = _execute(monkeypatch, {"KPOOL_BENCH_RUNS": str(tmp_path)})
    assert "throughput sections: targets-2cores-v3.json" not in text
    assert "memory section: default-2cores-v3.json" in text           # the newest with burst and frag
    import re
    burst, frag = map(int, re.search(r"burst rows: (\d+), frag rows: (\d+)", text).groups())
    assert burst > 0 and frag > 0
    assert "comparing targets-2cores-v3.json" in text and "-> targets-2cores-v4.json" in text
    assert "[:11]" not in NOTEBOOK.read_text()


def test_notebook_summary_is_not_cut(monkeypatch):
    nb, text = _execute(monkeypatch, {"KPOOL_BENCH_RUN": str(SMALL_RUN)})
    from kpool import bench
    import re
    lines = text[text.index("median Mops/s (ratio to system)"):].splitlines()
    table = lines[:2]
    for line in lines[2:]:
        if not line.split() or line.split()[0] not in bench.WORKLOADS:
            break
        table.append(line)
    assert len(table) > 4
    assert len({len(line) for line in table[1:]}) == 1, table        # aligned columns
    res = bench.load(SMALL_RUN)
    big = max(s["mops_median"] for s in res.summary() if s["workload"] not in bench.MEMORY_WORKLOADS)
    assert any(re.search(r"\b%.1f \(\d+\.\d\d\)" % big, line) for line in table), table


def test_one_palette_in_every_figure():
    """Each allocator has one colour: kpool.bench.color_of, used by Result.plot()
    and by every allocator-coloured figure of the notebook."""
    from kpool import bench
    assert set(bench.PALETTE) == set(bench.ALLOCATORS)
    assert len(set(bench.PALETTE.values())) == len(bench.PALETTE)
    assert bench.color_of("kpool") == bench.PALETTE["kpool"]
    assert bench.color_of("other-malloc") == bench.color_of("other-malloc")
    src = NOTEBOOK.read_text()
    assert '"C%d"' not in src and "bench.color_of(a)" in src
    assert src.count("color=bench.color_of(a)") >= 2       # scaling lines and ratio bars


def test_bench_plot_uses_the_palette(monkeypatch, tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.colors as mcolors
    import matplotlib.pyplot as plt
    from kpool import bench

    # the allocators in an order unlike bench.ALLOCATORS: colours must not follow the plotting order
    recs = []
    for rnd in range(2):
        for a in ("kpool", "mimalloc", "system", "null"):
            for t in (1, 2):
                recs.append({"workload": "pairs", "threads": t, "allocator": a, "round": rnd,
                             "ops_per_sec": 1e6 * (t + rnd), "error": None, "corrupt": 0})
    figs = []
    monkeypatch.setattr(plt, "close", lambda fig=None: figs.append(fig))
    bench.Result(recs, {"machine": {"cores": 2}}).plot(tmp_path / "p.png")
    ax = figs[0].axes[0]
    seen = {}
    for container in ax.containers:
        seen[container.get_label()] = mcolors.to_hex(container.lines[0].get_color())
    assert seen == {a: bench.color_of(a) for a in ("system", "mimalloc", "kpool", "null")}
    bars = figs[0].axes[1]
    for patch in bars.patches:
        assert mcolors.to_hex(patch.get_facecolor()) in {bench.color_of("mimalloc"), bench.color_of("kpool")}
