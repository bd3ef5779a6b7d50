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
