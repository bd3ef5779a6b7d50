"""The C core's own tests (csrc/tests), run through make so that one pytest
command covers the whole project: every layer's unit tests, the heap and
pool stress program, and the stress driver with verification on."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

CSRC = Path(__file__).resolve().parent.parent / "csrc"

pytestmark = pytest.mark.skipif(
    not (CSRC / "Makefile").exists() or shutil.which("make") is None,
    reason="needs the source tree's csrc/ and make",
)


def test_c_unit_tests_and_stress_pass():
    env = dict(os.environ, KP_TEST_BURST_MB=os.environ.get("KP_TEST_BURST_MB", "1024"))
    proc = subprocess.run(
        ["make", "-s", "-C", str(CSRC), "test", "B=build-pytest"],
        capture_output=True, text=True, env=env, timeout=900,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "C tests: all passed" in out
    failed = [line for line in out.splitlines() if line.endswith(" failed") and not line.endswith(" 0 failed")]
    assert not failed, failed
    # every test program reported its totals, and the burst check ran
    assert out.count(" passed, 0 failed") >= 9
    assert "after free + 1 s" in out
