"""The long run of tests/test_stateful.py's state machine (the Python API
against a model): marked slow, run by CI's `-m slow tests/stress` step.
KPOOL_STATEFUL_EXAMPLES (default 100; the documented long run used 500) and KPOOL_STATEFUL_STEPS (default 30)
size it; the run in tests/ is 30 x 30."""
import os
import sys

import pytest

pytest.importorskip("hypothesis")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from test_stateful import KpoolMachine, machine_settings  # noqa: E402

pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("KPOOL_STATEFUL_EXAMPLES", "100"))
STEPS = int(os.environ.get("KPOOL_STATEFUL_STEPS", "30"))

TestKpoolStatefulLong = KpoolMachine.TestCase
TestKpoolStatefulLong.settings = machine_settings(EXAMPLES, STEPS)
