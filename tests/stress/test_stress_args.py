"""Bad arguments to kpool.stress: ValueError or TypeError, never a crash."""
import pytest

import kpool


@pytest.mark.parametrize("kwargs", [
    {"workload": "nope"},
    {"workload": ""},
    {"allocator": "nope"},
    {"allocator": "jemalloc"},          # peers are bench's business (LD_PRELOAD), not stress's
    {"threads": 0},
    {"threads": -1},
    {"ops": 0},
    {"ops": -5},
    {"workload": "mixed", "allocator": "kpool-pool"},
    {"workload": "larson", "allocator": "kpool-pool"},
])
def test_bad_arguments_raise_value_error(kwargs):
    kw = {"ops": 100, "threads": 1}
    kw.update(kwargs)
    workload = kw.pop("workload", "mixed")
    with pytest.raises((ValueError, OverflowError)):
        kpool.stress(workload, **kw)


@pytest.mark.parametrize("kwargs", [
    {"threads": "2"},
    {"ops": 1.5},
    {"allocator": 3},
])
def test_bad_types_raise_type_error(kwargs):
    kw = {"ops": 100, "threads": 1}
    kw.update(kwargs)
    with pytest.raises(TypeError):
        kpool.stress("mixed", **kw)


def test_bad_workload_type():
    with pytest.raises(TypeError):
        kpool.stress(42, ops=100)


def test_error_message_names_the_choices():
    with pytest.raises(ValueError) as e:
        kpool.stress("mixed", allocator="kpool-pool", ops=100, threads=1)
    assert "pairs" in str(e.value)


def test_small_runs_are_clean():
    r = kpool.stress("mixed", threads=3, ops=10, verify=True)
    assert r["ops"] == 10 and r["corrupt"] == 0
    r = kpool.stress("larson", threads=8, ops=3, verify=True)   # fewer ops than threads
    assert r["ops"] == 3 and r["corrupt"] == 0
