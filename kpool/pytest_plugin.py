"""pytest plugin for code that uses kpool: memory per test, leaks, fixtures.

pytest loads it by itself wherever kpool is installed (the pytest11 entry
point "kpool"; ``-p no:kpool`` turns it off, ``-p kpool`` loads it where
entry points are disabled; ``-p kpool.pytest_plugin`` or a conftest's
pytest_plugins naming the module would load it a second time, which pytest
refuses). Without its options it only
adds the fixtures and a marker. Loading it imports the kpool package, and
with it kpool's C core (about 10 ms and 3 MB of RSS); the core's heap maps
nothing until something allocates from it.

Options:
  --kpool-report        after the run, a table of every test: the kpool
                        allocations and frees it made (kpool.stats()'s
                        allocs, frees), the net change of kpool's bytes in
                        use, and the kpool Blocks it left alive; then the
                        tests that left Blocks (heap, pool buffers, arena
                        blocks) alive after their teardown, with where they
                        were allocated when tracemalloc is on (python -X
                        tracemalloc=10 -m pytest, or PYTHONTRACEMALLOC=10).
  --kpool-fail-on-leak  such a test fails: its teardown is reported failed
                        with the leak (also without --kpool-report). A test
                        that failed already is not failed again (its
                        traceback may be what holds the Blocks).

Live Blocks are counted before a test's setup and after its teardown, each
after a garbage collection; Blocks that a fixture of a wider scope (module,
session, ...) makes or frees are not the test's. With tracemalloc on, the
plugin takes a snapshot of kpool's traces at the first test, after each
test that leaks and around wider-scoped fixtures, not per test; a leak's
allocation sites are the kpool traces that are new since the last one.

Fixtures:
  kpool_stats   a KpoolStatsDelta: kpool.stats() now minus kpool.stats() at
                the start of the test, by attribute (kpool_stats.allocs,
                .bytes_in_use, .live_blocks, ...) or all at once (.delta()).
  buffer_pool   a fresh kpool.BufferPool of 4096-byte buffers, closed after
                the test; the test's teardown fails if buffers are still in
                use. Other arguments: @pytest.mark.kpool_buffer_pool(size,
                capacity=..., ...) or indirect parametrization with a size
                or a dict of keyword arguments.
"""
import gc

import pytest

__all__ = ["KpoolStatsDelta"]

_KINDS = ("heap", "pool", "arena")
_NOT_DELTAS = {"version", "enabled", "requested_exact", "tcaches_unavailable", "internal_fragmentation",
               "external_fragmentation", "classes"}


def _kpool():
    import kpool

    return kpool


def _live():
    """Live kpool Blocks now, (heap, pool, arena)."""
    return tuple(_kpool()._core.live_blocks())


def _sub(a, b):
    return tuple(x - y for x, y in zip(a, b))


def _add(a, b):
    return tuple(x + y for x, y in zip(a, b))


def _blocks_text(counts):
    """'2 heap Blocks, 1 pool buffer' for a (heap, pool, arena) tuple."""
    names = (("heap Block", "heap Blocks"), ("pool buffer", "pool buffers"), ("arena block", "arena blocks"))
    parts = ["%d %s" % (n, names[i][n != 1]) for i, n in enumerate(counts) if n]
    return ", ".join(parts) or "no Blocks"


def _kpool_snapshot():
    """A tracemalloc.Snapshot of the traces in kpool's domain, or None when
    tracemalloc is not tracing. Picks them out of _tracemalloc._get_traces()
    (what take_snapshot() reads) without a Python-level loop over every
    trace; take_snapshot().filter_traces() if that is not there."""
    import tracemalloc

    if not tracemalloc.is_tracing():
        return None
    domain = _kpool().TRACEMALLOC_DOMAIN
    try:
        from itertools import compress
        from operator import itemgetter

        import _tracemalloc

        traces = _tracemalloc._get_traces()  # (domain, size, traceback, ...) tuples
        mine = list(compress(traces, map(domain.__eq__, map(itemgetter(0), traces))))
        return tracemalloc.Snapshot(mine, tracemalloc.get_traceback_limit())
    except Exception:  # pragma: no cover - another Python's private API
        return tracemalloc.take_snapshot().filter_traces([tracemalloc.DomainFilter(True, domain)])


# ---- options and markers -----------------------------------------------------------


def pytest_addoption(parser):
    group = parser.getgroup("kpool", "kpool memory (kpool.pytest_plugin)")
    group.addoption("--kpool-report", action="store_true", default=False,
                    help="after the run, print each test's kpool allocations, frees, net bytes and live Blocks, "
                         "and the tests that leave kpool Blocks alive (where they were allocated when "
                         "tracemalloc is on)")
    group.addoption("--kpool-fail-on-leak", action="store_true", default=False,
                    help="fail a test that leaves kpool Blocks or pool buffers alive after its teardown")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "kpool_buffer_pool(buffer_size=4096, **kwargs): the arguments of the kpool.BufferPool that "
                   "the buffer_pool fixture makes")
    if config.getoption("kpool_report") or config.getoption("kpool_fail_on_leak"):
        config.pluginmanager.register(_Tracker(config), "kpool-tracker")


# ---- fixtures ------------------------------------------------------------------------


class KpoolStatsDelta:
    """kpool.stats() now minus kpool.stats() when this object was made (or
    last reset()): the counters (allocs, frees, ...) and gauges
    (bytes_in_use, bytes_requested, ...) as differences, plus live_blocks
    (kpool Blocks alive) and live_heap, live_pool, live_arena. Each reading
    first runs a garbage collection, so that dead Blocks count as freed.
    bytes_requested is kpool's estimate once any free in the process went
    without its size (before["requested_exact"] is then False): compare
    bytes_in_use instead.

        def test_x(kpool_stats):
            ...
            assert kpool_stats.live_blocks == 0
            assert kpool_stats.delta()["allocs"] >= 3
    """

    def __init__(self):
        self.reset()

    def reset(self):
        """Start counting from now."""
        gc.collect()
        self.before = _kpool().stats()
        self.live_before = _live()

    def now(self):
        """kpool.stats() now (after a garbage collection)."""
        gc.collect()
        return _kpool().stats()

    def delta(self):
        """Every numeric field of kpool.stats() as now minus before, plus the live Block counts."""
        now = self.now()
        d = {k: v - self.before.get(k, 0) for k, v in now.items()
             if k not in _NOT_DELTAS and isinstance(v, int) and not isinstance(v, bool)}
        live = _sub(_live(), self.live_before)
        d["live_blocks"] = sum(live)
        for kind, n in zip(_KINDS, live):
            d["live_" + kind] = n
        return d

    def __getattr__(self, name):
        if name.startswith("_") or name in ("before", "live_before"):
            raise AttributeError(name)
        d = self.delta()
        if name not in d:
            raise AttributeError("kpool_stats has no field %r (kpool.stats() keys, live_blocks, live_heap, "
                                 "live_pool, live_arena)" % name)
        return d[name]

    def __repr__(self):
        d = self.delta()
        return "<KpoolStatsDelta allocs=%+d frees=%+d bytes_in_use=%+d live_blocks=%+d>" % (
            d["allocs"], d["frees"], d["bytes_in_use"], d["live_blocks"])


@pytest.fixture
def kpool_stats():
    """kpool.stats() differences since the start of the test (a KpoolStatsDelta)."""
    return KpoolStatsDelta()


@pytest.fixture
def buffer_pool(request):
    """A fresh kpool.BufferPool (4096-byte buffers unless a kpool_buffer_pool
    marker or indirect parametrization says otherwise), closed after the
    test; buffers still in use then fail the test's teardown."""
    kpool = _kpool()
    options = {"buffer_size": 4096}
    marker = request.node.get_closest_marker("kpool_buffer_pool")
    if marker is not None:
        if len(marker.args) > 1:
            raise pytest.UsageError("kpool_buffer_pool takes one positional argument (buffer_size), "
                                    "the rest by keyword")
        if marker.args:
            options["buffer_size"] = marker.args[0]
        options.update(marker.kwargs)
    # indirect parametrization: a size, or keyword arguments merged over the marker's
    param = getattr(request, "param", None)
    if isinstance(param, dict):
        options.update(param)
    elif param is not None:
        options["buffer_size"] = param
    pool = kpool.BufferPool(**options)
    yield pool
    if pool.in_use:
        gc.collect()  # Blocks that only a reference cycle kept
    if pool.in_use:
        pytest.fail("buffer_pool: %d buffer%s still in use after the test (release them, or use "
                    "`with pool.acquire() as buf:`)" % (pool.in_use, "" if pool.in_use == 1 else "s"), pytrace=False)
    pool.close()


# ---- the tracker: --kpool-report, --kpool-fail-on-leak ---------------------------------


class _Record:
    __slots__ = ("nodeid", "allocs", "frees", "net_bytes", "leaked", "where", "failed", "failed_on_leak")

    def __init__(self, nodeid):
        self.nodeid = nodeid
        self.allocs = self.frees = self.net_bytes = 0
        self.leaked = (0, 0, 0)
        self.where = None      # lines about where the leaked blocks were allocated, or None
        self.failed = False    # the test itself failed
        self.failed_on_leak = False


class _Tracker:
    """Measures each test from before its setup to after its teardown."""

    def __init__(self, config):
        self.report = config.getoption("kpool_report")
        self.fail = config.getoption("kpool_fail_on_leak")
        self.records = []
        self.current = None       # the _Record of the test running
        self.start_live = None
        self.start_stats = None
        self.scoped = (0, 0, 0)   # live Blocks made (+) or freed (-) by wider-scoped fixtures in this test
        # tracemalloc snapshot of kpool's domain (None: tracemalloc off, or not
        # taken yet): taken at the first test and again only after a leak or a
        # wider-scoped fixture's setup or teardown, so tests cost no snapshot
        self.baseline = None

    # -- helpers --
    def _refresh_baseline(self):
        """With tracemalloc on: the kpool traces now become the baseline that
        the next leak's traces are told apart from."""
        self.baseline = _kpool_snapshot()

    # -- hooks --
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(self, item):
        gc.collect()
        self.current = _Record(item.nodeid)
        self.scoped = (0, 0, 0)
        self.start_stats = _kpool().stats()
        self.start_live = _live()
        if self.baseline is None:
            self._refresh_baseline()
        yield

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        if fixturedef.scope == "function" or self.current is None:
            yield
            return
        before = _live()
        yield
        self.scoped = _add(self.scoped, _sub(_live(), before))
        if self.baseline is not None:
            self._refresh_baseline()
        # before the fixture's own teardown runs (finalizers run last-in first-out)
        marks = {}

        def note_before_teardown():
            marks["before"] = _live()

        fixturedef.addfinalizer(note_before_teardown)
        fixturedef._kpool_teardown_marks = marks

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_post_finalizer(self, fixturedef, request):
        yield
        marks = getattr(fixturedef, "_kpool_teardown_marks", None)
        if marks and "before" in marks and self.current is not None:
            gc.collect()
            self.scoped = _add(self.scoped, _sub(_live(), marks.pop("before")))
            if self.baseline is not None:
                self._refresh_baseline()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        report = outcome.get_result()
        rec = self.current
        if rec is None or rec.nodeid != item.nodeid:
            return
        if call.when in ("setup", "call") and (report.failed or hasattr(report, "wasxfail")):
            rec.failed = True   # (an xfail raised too: its traceback may hold Blocks)
        if call.when != "teardown":
            return
        gc.collect()
        now = _kpool().stats()
        live = _live()
        rec.allocs = now["allocs"] - self.start_stats["allocs"]
        rec.frees = now["frees"] - self.start_stats["frees"]
        rec.net_bytes = now["bytes_in_use"] - self.start_stats["bytes_in_use"]
        leaked = _sub(_sub(live, self.start_live), self.scoped)
        rec.leaked = tuple(max(0, n) for n in leaked)
        if sum(rec.leaked) and self.baseline is not None:
            now_snapshot = _kpool_snapshot()
            if now_snapshot is not None:
                rec.where = self._where(self.baseline, now_snapshot, sum(rec.leaked))
            self.baseline = now_snapshot
        self.records.append(rec)
        self.current = None
        if self.fail and sum(rec.leaked) and not rec.failed and not report.failed:
            rec.failed_on_leak = True
            report.outcome = "failed"
            report.longrepr = "kpool leak: " + self._leak_text(rec)
            report._kpool_leak = True

    @pytest.hookimpl(tryfirst=True)
    def pytest_report_teststatus(self, report, config):
        if getattr(report, "_kpool_leak", False):
            return "failed", "L", ("LEAKED", {"red": True})
        return None

    @staticmethod
    def _where(before, after, leaked):
        """Lines naming the allocation sites of kpool traces that are new in after."""
        lines, total = [], 0
        for diff in after.compare_to(before, "traceback"):
            if diff.count_diff <= 0:
                continue
            total += diff.count_diff
            lines.append("%d block%s, %d bytes, allocated at:" % (
                diff.count_diff, "" if diff.count_diff == 1 else "s", diff.size_diff))
            lines.extend("    " + line for line in diff.traceback.format())
        if total > leaked:
            lines.append("(%d traced blocks for %d leaked: blocks that an earlier test kept while freeing others "
                         "are listed too)" % (total, leaked))
        return lines

    @staticmethod
    def _leak_text(rec):
        text = "%s left %s alive after its teardown (net %+d bytes of kpool memory)" % (
            rec.nodeid, _blocks_text(rec.leaked), rec.net_bytes)
        if rec.where:
            text += "\n" + "\n".join("  " + line for line in rec.where)
        elif rec.where is None:
            text += "\n  (run with python -X tracemalloc=10 -m pytest, or PYTHONTRACEMALLOC=10, to see where " \
                    "they were allocated)"
        if rec.failed:
            text += "\n  (the test failed: its traceback may be what keeps them alive)"
        return text

    def pytest_terminal_summary(self, terminalreporter):
        tr = terminalreporter
        if self.report:
            tr.write_sep("=", "kpool report")
            width = max([len(r.nodeid) for r in self.records] + [4])
            tr.write_line("%-*s %9s %9s %12s %11s" % (width, "test", "allocs", "frees", "net bytes", "left alive"))
            for r in self.records:
                tr.write_line("%-*s %9d %9d %+12d %11d" % (width, r.nodeid, r.allocs, r.frees, r.net_bytes,
                                                           sum(r.leaked)))
        leaks = [r for r in self.records if sum(r.leaked)]
        if leaks:
            tr.write_sep("=", "kpool leaks: %d test%s left kpool Blocks alive" % (
                len(leaks), "" if len(leaks) == 1 else "s"), red=True)
            for r in leaks:
                for line in self._leak_text(r).splitlines():
                    tr.write_line(line)
        elif self.report:
            tr.write_line("kpool leaks: none (no test left kpool Blocks alive after its teardown)")
