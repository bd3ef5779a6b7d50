"""kpool's pytest plugin (issue 16 item 3), tested with pytester: loaded
through the pytest11 entry point, --kpool-report, --kpool-fail-on-leak,
where leaked blocks were allocated under tracemalloc, and the kpool_stats
and buffer_pool fixtures."""
import re
import sys

import pytest

from conftest import kpool

pytest_plugins = ["pytester"]

LEAKY = """
    import kpool
    import pytest

    kept = []

    def test_clean():
        b = kpool.malloc(100)
        b.release()
        with kpool.BufferPool(64) as pool:
            with pool.acquire():
                pass

    def test_leaks_a_heap_block():
        kept.append(kpool.malloc(1000))

    def test_leaks_a_pool_buffer():
        pool = kpool.BufferPool(256)
        kept.append(pool.acquire())

    def test_leaks_an_arena_block():
        arena = kpool.Arena()
        kept.append(arena.alloc(10))

    def test_arena_reset_is_no_leak():
        arena = kpool.Arena()
        kept.append(arena.alloc(10))
        arena.reset()

    def test_fails_and_leaks():
        kept.append(kpool.malloc(5))
        assert False
"""


def leak_lines(out):
    section = out[out.index("kpool leaks:"):]
    return [line for line in section.splitlines() if " left " in line]


def test_plugin_is_registered_through_the_entry_point(pytester):
    from importlib.metadata import entry_points

    eps = entry_points()
    group = eps.select(group="pytest11") if hasattr(eps, "select") else eps.get("pytest11", [])
    assert any(ep.name == "kpool" and ep.value == "kpool.pytest_plugin" for ep in group)
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(["*--kpool-report*", "*--kpool-fail-on-leak*"])
    result = pytester.runpytest("--fixtures")
    result.stdout.fnmatch_lines(["*kpool_stats*", "*buffer_pool*"])
    result = pytester.runpytest("-p", "no:kpool", "--help")
    assert "--kpool-report" not in result.stdout.str()


def test_loading_the_plugin_maps_no_kpool_memory(pytester):
    """The plugin's docstring: loading it imports kpool (its C core), and the
    core's heap maps nothing until something allocates from it."""
    pytester.makepyfile("""
        import sys

        def test_nothing_allocated_yet():
            assert "kpool._core" in sys.modules      # the plugin imported it
            s = sys.modules["kpool"].stats()
            assert s["bytes_mapped"] == 0 and s["allocs"] == 0, s
    """)
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=1)


def test_without_options_nothing_is_reported(pytester):
    pytester.makepyfile(LEAKY)
    result = pytester.runpytest()
    result.assert_outcomes(passed=5, failed=1)
    out = result.stdout.str()
    assert "kpool report" not in out and "kpool leak" not in out and "left 1" not in out


def test_report_lists_every_test_and_the_leaks(pytester):
    pytester.makepyfile(LEAKY)
    result = pytester.runpytest("--kpool-report")
    result.assert_outcomes(passed=5, failed=1)   # the report alone fails nothing
    out = result.stdout.str()
    assert "kpool report" in out
    rows = {m.group(1): (int(m.group(2)), int(m.group(3)), int(m.group(5)))
            for m in re.finditer(r"^\S+::(\w+)\s+(\d+)\s+(\d+)\s+([+-]\d+)\s+(\d+)$", out, re.M)}
    assert set(rows) == {"test_clean", "test_leaks_a_heap_block", "test_leaks_a_pool_buffer",
                         "test_leaks_an_arena_block", "test_arena_reset_is_no_leak", "test_fails_and_leaks"}
    allocs, frees, left = rows["test_clean"]
    assert allocs >= 1 and frees >= 1 and left == 0   # malloc(100) at least; pool buffers come from chunks
    assert rows["test_leaks_a_heap_block"][0] >= 1 and rows["test_leaks_a_heap_block"][2] == 1
    assert rows["test_leaks_a_pool_buffer"][2] == 1 and rows["test_leaks_an_arena_block"][2] == 1
    assert rows["test_arena_reset_is_no_leak"][2] == 0
    assert "kpool leaks: 4 tests left kpool Blocks alive" in out
    lines = leak_lines(out)
    assert any("test_leaks_a_heap_block left 1 heap Block alive" in line for line in lines)
    assert any("test_leaks_a_pool_buffer left 1 pool buffer alive" in line for line in lines)
    assert any("test_leaks_an_arena_block left 1 arena block alive" in line for line in lines)
    assert any("test_fails_and_leaks left 1 heap Block alive" in line for line in lines)
    assert "its traceback may be what keeps them alive" in out
    assert "PYTHONTRACEMALLOC=10" in out          # tracemalloc was off: how to see where


def test_fail_on_leak_fails_the_leaking_tests(pytester):
    pytester.makepyfile(LEAKY)
    result = pytester.runpytest("--kpool-fail-on-leak")
    # 3 leaking tests fail in their teardown; test_fails_and_leaks failed already and is not failed twice
    result.assert_outcomes(passed=5, failed=4)
    assert result.ret == 1
    out = result.stdout.str()
    result.stdout.fnmatch_lines(["*kpool leak: *test_leaks_a_heap_block left 1 heap Block alive*"])
    assert "kpool report" not in out    # the table only with --kpool-report
    assert "kpool leaks: 4 tests left kpool Blocks alive" in out
    summary = [line for line in out.splitlines() if line.startswith("LEAKED ")]   # the short summary
    assert sum("test_leaks_" in line for line in summary) == 3
    assert [line for line in out.splitlines() if line.startswith("FAILED ")] == [
        line for line in out.splitlines() if line.startswith("FAILED ") and "test_fails_and_leaks" in line]


def test_fail_on_leak_passes_clean_tests(pytester):
    pytester.makepyfile(
        """
        import kpool

        def test_clean(buffer_pool, kpool_stats):
            with buffer_pool.acquire() as b:
                b[0] = 1
            blocks = [kpool.malloc(n) for n in (1, 100, 10000)]
            del blocks
            assert kpool_stats.live_blocks == 0
        """)
    result = pytester.runpytest("--kpool-fail-on-leak", "--kpool-report")
    result.assert_outcomes(passed=1)
    assert "kpool leaks: none" in result.stdout.str()


def test_where_leaked_blocks_were_allocated_with_tracemalloc(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONTRACEMALLOC", "5")
    pytester.makepyfile(
        test_where="""
        import kpool

        kept = []

        def helper():
            return kpool.malloc(777)

        def test_before():
            kept.append(kpool.malloc(11))   # leaked by an earlier test: not test_leak's

        def test_leak():
            kpool.malloc(5).release()
            kept.append(helper())
            pool = kpool.BufferPool(300)
            kept.append(pool.acquire())
        """)
    # (hypothesis left out: importing it under tracemalloc takes most of the time)
    result = pytester.runpytest_subprocess("--kpool-fail-on-leak", "-p", "no:cacheprovider", "-p", "no:hypothesispytest")
    result.assert_outcomes(passed=2, failed=2)
    out = result.stdout.str()
    section = out[out.index("test_where.py::test_leak left"):]
    section = section[:section.index("\n", section.index("kept.append(pool.acquire())"))]
    assert "1 heap Block, 1 pool buffer" in section
    assert "1 block, 777 bytes, allocated at:" in section and "return kpool.malloc(777)" in section
    assert "kept.append(helper())" in section                # the traceback has the caller too
    assert "1 block, 300 bytes, allocated at:" in section
    assert "11 bytes" not in section and "PYTHONTRACEMALLOC" not in section


def test_wider_scoped_fixtures_are_not_the_tests_leaks(pytester):
    pytester.makepyfile(
        """
        import kpool
        import pytest

        @pytest.fixture(scope="module")
        def shared():
            b = kpool.malloc(64)
            yield b
            b.release()

        @pytest.fixture(scope="session")
        def session_pool():
            pool = kpool.BufferPool(128)
            buf = pool.acquire()
            yield buf
            buf.release()
            pool.close()

        def test_a(shared, session_pool):
            assert len(shared) == 64

        def test_b(shared, session_pool):
            assert len(session_pool) == 128

        def test_c():
            pass
        """)
    result = pytester.runpytest("--kpool-fail-on-leak", "--kpool-report")
    result.assert_outcomes(passed=3)
    assert "kpool leaks: none" in result.stdout.str()


def test_kpool_stats_fixture(pytester):
    pytester.makepyfile(
        """
        import kpool

        def test_delta(kpool_stats):
            assert kpool_stats.allocs == 0 and kpool_stats.live_blocks == 0
            b = kpool.malloc(5000)
            assert kpool_stats.live_blocks == 1 and kpool_stats.live_heap == 1
            assert kpool_stats.allocs >= 1 and kpool_stats.bytes_in_use >= 5000
            exact = kpool_stats.before["requested_exact"]   # else kpool estimates bytes_requested
            assert kpool_stats.bytes_requested == 5000 or not exact
            arena = kpool.Arena()
            a = arena.alloc(10)
            assert kpool_stats.delta()["live_arena"] == 1
            arena.reset()
            b.release()
            d = kpool_stats.delta()
            assert d["live_blocks"] == 0 and d["bytes_in_use"] == 0 and d["frees"] >= 1
            assert d["bytes_requested"] == 0 or not exact
            assert "classes" not in d and "version" not in d
            assert "KpoolStatsDelta" in repr(kpool_stats)
            kpool_stats.reset()
            assert kpool_stats.allocs == 0
            try:
                kpool_stats.nonsense
            except AttributeError as e:
                assert "nonsense" in str(e)
            else:
                raise AssertionError("no AttributeError")
        """)
    result = pytester.runpytest()
    result.assert_outcomes(passed=1)


def test_buffer_pool_fixture(pytester):
    pytester.makepyfile(
        """
        import kpool
        import pytest

        pools = []

        def test_default(buffer_pool):
            assert isinstance(buffer_pool, kpool.BufferPool) and buffer_pool.buffer_size == 4096
            pools.append(buffer_pool)
            with buffer_pool.acquire() as b:
                assert len(b) == 4096

        def test_closed_after_the_test():
            assert pools[0].closed

        def test_fresh_each_time(buffer_pool):
            assert buffer_pool is not pools[0] and buffer_pool.stats()["acquires"] == 0

        @pytest.mark.kpool_buffer_pool(256, capacity=2, zero=True)
        def test_marker(buffer_pool):
            assert buffer_pool.buffer_size == 256 and buffer_pool.capacity == 2 and buffer_pool.zero

        @pytest.mark.parametrize("buffer_pool", [64, {"buffer_size": 512, "capacity": 1}], indirect=True)
        def test_indirect(buffer_pool):
            assert buffer_pool.buffer_size in (64, 512)

        @pytest.mark.kpool_buffer_pool(buffer_size=128, capacity=3)   # the marker's help's own form
        def test_marker_by_keyword(buffer_pool):
            assert buffer_pool.buffer_size == 128 and buffer_pool.capacity == 3

        @pytest.mark.kpool_buffer_pool(256, capacity=2)
        @pytest.mark.parametrize("buffer_pool", [{"zero": True}, 1024], indirect=True)
        def test_marker_and_indirect_merge(buffer_pool):
            # the parameter's keywords go over the marker's, which stay
            assert buffer_pool.capacity == 2
            assert (buffer_pool.buffer_size, buffer_pool.zero) in ((256, True), (1024, False))

        def test_left_in_use(buffer_pool):
            pools.append(buffer_pool.acquire())
        """)
    result = pytester.runpytest()
    result.assert_outcomes(passed=10, errors=1)  # test_left_in_use passed, its teardown did not
    result.stdout.fnmatch_lines(["*buffer_pool: 1 buffer still in use after the test*"])


def test_plugin_reports_numpy_arrays_on_kpool(pytester):
    pytest.importorskip("numpy")
    pytester.makepyfile(
        """
        import numpy as np
        import kpool

        kept = []

        def test_arrays(kpool_stats):
            with kpool.use_for_numpy():
                a = np.zeros(10000)
            exact = kpool_stats.before["requested_exact"]
            assert kpool_stats.allocs == 1 and kpool_stats.bytes_in_use >= a.nbytes
            assert kpool_stats.bytes_requested == a.nbytes or not exact
            del a
            assert kpool_stats.bytes_in_use == 0 and kpool_stats.frees == 1
            assert kpool_stats.live_blocks == 0  # numpy arrays are not Blocks
        """)
    result = pytester.runpytest("--kpool-report")
    result.assert_outcomes(passed=1)
    assert re.search(r"test_arrays\s+[1-9]\d*\s+[1-9]\d*\s+[+-]\d+\s+0$", result.stdout.str(), re.M)


def test_inline_and_outer_sessions_do_not_mix(pytester):
    """A pytester run inside a tracked session keeps its own records."""
    pytester.makepyfile("def test_x():\n    pass\n")
    first = pytester.runpytest("--kpool-report")
    second = pytester.runpytest("--kpool-report")
    for r in (first, second):
        r.assert_outcomes(passed=1)
        assert r.stdout.str().count("::test_x ") == 1
    assert sys.modules["kpool"] is kpool


def test_xfail_that_leaks_is_not_failed(pytester):
    """An expected failure's traceback may hold Blocks: reported, not failed."""
    pytester.makepyfile(
        """
        import kpool
        import pytest

        @pytest.mark.xfail(strict=True)
        def test_x():
            b = kpool.malloc(10)
            raise RuntimeError(b)
        """)
    result = pytester.runpytest("--kpool-fail-on-leak")
    result.assert_outcomes(xfailed=1)
