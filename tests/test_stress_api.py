"""kpool.stress(): the Python entry point of the C stress driver (argument
checking, the result dict, kpool_stats, Ctrl-C). The workload suites
themselves live in tests/stress/."""
import shutil
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import kpool, run_python

pytestmark = pytest.mark.skipif(not getattr(kpool._core, "HAVE_STRESS", 0), reason="no stress driver in this build")


def test_result_is_a_dict_with_kpool_stats():
    r = kpool.stress("pairs", threads=1, ops=20000)
    assert isinstance(r, dict)
    assert r["workload"] == "pairs" and r["allocator"] == "kpool"
    assert r["corrupt"] == 0
    assert r["ops"] >= 1
    assert isinstance(r["kpool_stats"], dict)
    assert "bytes_in_use" in r["kpool_stats"]


@pytest.mark.parametrize("workload", ["pairs", "mixed", "random", "larson", "prodcons", "frag"])
def test_every_workload_runs_verified(workload):
    r = kpool.stress(workload, threads=2, ops=20000, verify=True, seed=7)
    assert r["corrupt"] == 0
    assert r["workload"] == workload


def test_system_allocator_has_no_kpool_stats():
    r = kpool.stress("mixed", threads=2, ops=10000, allocator="system")
    assert "kpool_stats" not in r
    assert r["corrupt"] == 0


def test_pool_allocator():
    r = kpool.stress("pairs", threads=1, ops=10000, allocator="kpool-pool")
    assert r["corrupt"] == 0


def test_bad_names_are_value_errors():
    with pytest.raises(ValueError):
        kpool.stress("nosuch", ops=10)
    with pytest.raises(ValueError):
        kpool.stress("mixed", allocator="nosuch", ops=10)


@pytest.mark.parametrize("kw", [{"threads": 0}, {"threads": -1}, {"threads": 1025}, {"ops": 0}, {"ops": -5},
                                {"size": -1}, {"size": 2**40}, {"burst_bytes": -1}])
def test_bad_counts_are_value_errors(kw):
    with pytest.raises(ValueError):
        kpool.stress("mixed", **kw)


def test_wrong_types_are_type_errors():
    with pytest.raises(TypeError):
        kpool.stress(1)
    with pytest.raises(TypeError):
        kpool.stress("mixed", threads="4")
    with pytest.raises(TypeError):
        kpool.stress("mixed", ops=1.5)
    with pytest.raises(TypeError):
        kpool.stress("mixed", allocator=None)
    with pytest.raises(TypeError):
        kpool.stress("mixed", seed="x")
    with pytest.raises(TypeError):
        kpool.stress("mixed", 4)  # options are keyword-only


def test_huge_values():
    with pytest.raises(OverflowError):
        kpool.stress("mixed", ops=1 << 80)
    with pytest.raises((ValueError, OverflowError)):
        kpool.stress("mixed", threads=1 << 40)


def test_the_drivers_memory_does_not_grow_with_ops():
    """ops=10**12 stopped by duration: the latency samples are a bounded
    reservoir (they used to be sized by ops: 7.4 GiB mapped and touched
    before the run began)."""
    r = kpool.stress("mixed", threads=2, ops=10**12, duration=0.2, verify=False)
    assert r["stopped"] and r["stop_reason"] == "duration" and r["ops"] < r["ops_requested"]
    assert r["peak_rss"] < 512 << 20
    assert 0 < r["samples"] <= (1 << 22) + 8
    assert r["p50_ns"] <= r["p99_ns"] <= r["max_ns"]


def test_seed_outside_64_bits_is_an_overflow_error_and_its_ends_are_taken():
    for bad in (-1, 1 << 64, -(1 << 70)):
        with pytest.raises(OverflowError, match="seed"):
            kpool.stress("pairs", threads=1, ops=100, seed=bad)
    for ok in (0, (1 << 64) - 1, True):
        r = kpool.stress("random", threads=1, ops=100, seed=ok)
        assert r["ops"] == 100 and r["seed"] == ok


def test_ctrl_c_stops_the_workers():
    proc = run_python(
        """
        import os, signal, threading, time, kpool
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
        t0 = time.monotonic()
        try:
            kpool.stress('mixed', threads=2, ops=10**10)
        except KeyboardInterrupt:
            print('interrupted', time.monotonic() - t0 < 60)
        r = kpool.stress('pairs', threads=1, ops=1000)
        assert r['corrupt'] == 0
        print('OK')
        """, timeout=120)
    assert proc.stdout.split() == ["interrupted", "True", "OK"]


def test_corruption_error_is_a_kpool_error():
    assert issubclass(kpool.CorruptionError, kpool.Error)


# A broken malloc for allocator="system", preloaded into a child: once armed,
# in threads other than the one that armed it (the stress workers), it either
# writes over a live block ("clobber") or hands a live block out a second time
# ("dup", swallowing the extra free). Only blocks of 16 bytes and more, and
# only their user bytes, are touched: glibc's heap stays sound.
BROKEN_MALLOC = r"""
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
extern void *__libc_malloc(size_t);
extern void __libc_free(void *);
static _Atomic int mode;                   /* 0 off, 1 clobber, 2 dup */
static pthread_t armer;
static _Atomic(void *) victim, dup_of;
static _Atomic unsigned long calls;
void broken_malloc_arm(int m) { armer = pthread_self(); atomic_store(&mode, m); }
void *malloc(size_t n) {
    int m = atomic_load(&mode);
    if (!m || n < 16 || pthread_equal(pthread_self(), armer)) return __libc_malloc(n);
    unsigned long k = atomic_fetch_add(&calls, 1) % 997;
    void *v = atomic_load(&victim);
    if (v && k == 500) {
        if (m == 1) {
            memset(v, 0x5a, 8);                 /* damage a live block */
            atomic_store(&victim, NULL);
            atomic_store(&mode, 0);
        } else if (malloc_usable_size(v) >= n) {
            atomic_store(&victim, NULL);
            atomic_store(&dup_of, v);
            atomic_store(&mode, 0);
            return v;                           /* a live block, handed out again */
        }
    }
    void *p = __libc_malloc(n);
    if (!v && k == 0) atomic_store(&victim, p);
    return p;
}
void free(void *p) {
    void *expected = p;
    if (p && atomic_compare_exchange_strong(&dup_of, &expected, NULL)) return;   /* the second holder's free */
    expected = p;
    if (p) atomic_compare_exchange_strong(&victim, &expected, NULL);
    __libc_free(p);
}
"""


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
@pytest.mark.parametrize("mode", ["clobber", "dup"])
def test_verify_raises_corruption_error_for_a_broken_allocator(tmp_path, mode):
    """stress(verify=True) finds a damaged block, or a live block handed out
    twice, and raises kpool.CorruptionError naming the run; verify=False
    does not look (the same broken allocator runs to the end)."""
    src = tmp_path / "broken_malloc.c"
    src.write_text(BROKEN_MALLOC)
    lib = tmp_path / "broken_malloc.so"
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-o", str(lib), str(src), "-lpthread"], check=True)
    code = """
        import ctypes, kpool
        arm = ctypes.CDLL(None).broken_malloc_arm
        arm(%d)
        try:
            kpool.stress('random', threads=1, ops=200000, allocator='system', verify=%s)
            print('no error')
        except kpool.CorruptionError as e:
            print('CorruptionError:', e)
        """
    m = {"clobber": 1, "dup": 2}[mode]
    proc = run_python(code % (m, True), env={"LD_PRELOAD": str(lib)})
    assert proc.stdout.startswith("CorruptionError: stress random/system: "), proc.stdout + proc.stderr
    assert "damaged" in proc.stdout or "overlap" in proc.stdout
    proc = run_python(code % (m, False), env={"LD_PRELOAD": str(lib)})
    assert proc.stdout.strip() == "no error", proc.stdout + proc.stderr


# ---- stopping a run: duration=, cancel=, stress_cancel(), exit, Ctrl-C (issue 15) ------------

LONG = 10**9   # ops no test waits for: each of these runs is stopped early


def test_duration_bounds_the_run():
    t0 = time.monotonic()
    r = kpool.stress("mixed", threads=2, ops=LONG, duration=0.4)
    wall = time.monotonic() - t0
    assert wall < 10, wall
    assert r["stopped"] is True and r["stop_reason"] == "duration"
    assert 0 < r["ops"] < r["ops_requested"] == LONG
    assert r["duration"] == pytest.approx(0.4)
    assert r["seconds"] < 5 and r["corrupt"] == 0


@pytest.mark.parametrize("workload", ["pairs", "random", "larson", "prodcons", "frag"])
def test_duration_stops_every_workload(workload):
    ops = 1 << 26 if workload == "frag" else LONG
    t0 = time.monotonic()
    r = kpool.stress(workload, threads=2, ops=ops, duration=0.3, verify=False)
    assert time.monotonic() - t0 < 20
    assert r["stopped"] and r["stop_reason"] == "duration" and r["ops"] < ops


def test_a_run_that_finishes_in_time_is_not_stopped():
    r = kpool.stress("pairs", threads=1, ops=10000, duration=60)
    assert r["stopped"] is False and r["stop_reason"] is None and r["ops"] == 10000


@pytest.mark.parametrize("bad,exc", [(0, ValueError), (-1, ValueError), (float("nan"), ValueError),
                                     (1e12, OverflowError), ("1", TypeError), (True, TypeError)])
def test_bad_durations(bad, exc):
    with pytest.raises(exc):
        kpool.stress("pairs", ops=10, duration=bad)


def test_bad_cancel_is_type_error():
    with pytest.raises(TypeError):
        kpool.stress("pairs", ops=10, cancel=object())
    with pytest.raises(TypeError):
        kpool.stress("pairs", ops=10, cancel=True)


def test_stress_cancel_from_the_main_thread_stops_a_worker_run():
    with ThreadPoolExecutor(1) as ex:
        f = ex.submit(kpool.stress, "mixed", threads=2, ops=LONG)
        time.sleep(0.3)
        cancelled, t0 = 0, time.monotonic()
        while not cancelled and time.monotonic() - t0 < 30:   # until the run has started
            cancelled = kpool.stress_cancel()
            time.sleep(0.02)
        assert cancelled == 1
        t1 = time.monotonic()
        r = f.result(timeout=30)
        assert time.monotonic() - t1 < 5
    assert r["stopped"] and r["stop_reason"] == "cancel" and 0 < r["ops"] < LONG
    assert r["corrupt"] == 0
    # a later run is not affected by the earlier cancel
    assert kpool.stress("pairs", threads=1, ops=1000)["stopped"] is False


def test_cancel_event_stops_one_run_of_several():
    ev_a, ev_b = threading.Event(), threading.Event()
    with ThreadPoolExecutor(2) as ex:
        fa = ex.submit(kpool.stress, "larson", threads=2, ops=LONG, cancel=ev_a)
        fb = ex.submit(kpool.stress, "prodcons", threads=2, ops=LONG, cancel=ev_b)
        time.sleep(0.3)
        ev_a.set()
        ra = fa.result(timeout=30)
        assert ra["stopped"] and ra["stop_reason"] == "cancel"
        assert not fb.done()                       # the other run goes on
        ev_b.set()
        rb = fb.result(timeout=30)
    assert rb["stopped"] and rb["stop_reason"] == "cancel"
    assert ra["corrupt"] == 0 and rb["corrupt"] == 0


def test_stress_cancel_stops_every_run():
    with ThreadPoolExecutor(3) as ex:
        fs = [ex.submit(kpool.stress, w, threads=1, ops=LONG) for w in ("pairs", "mixed", "random")]
        time.sleep(0.3)
        t0 = time.monotonic()
        while not all(f.done() for f in fs) and time.monotonic() - t0 < 30:
            kpool.stress_cancel()
            time.sleep(0.05)
        rs = [f.result(timeout=30) for f in fs]
    assert all(r["stop_reason"] == "cancel" and r["ops"] < LONG for r in rs)


def test_an_event_set_before_the_run_stops_it_at_once():
    ev = threading.Event()
    ev.set()
    t0 = time.monotonic()
    r = kpool.stress("mixed", threads=2, ops=LONG, cancel=ev)
    assert time.monotonic() - t0 < 10 and r["stop_reason"] == "cancel"


def test_is_set_raising_stops_the_run_and_propagates():
    class Boom:
        calls = 0

        def is_set(self):
            Boom.calls += 1
            if Boom.calls > 2:
                raise RuntimeError("boom")
            return False

    with pytest.raises(RuntimeError, match="boom"):
        kpool.stress("mixed", threads=2, ops=LONG, cancel=Boom())


@pytest.mark.parametrize("how", ["thread", "daemon", "executor", "executor-first"])
def test_sigint_ends_a_process_whose_worker_thread_runs_stress(how):
    """The main thread waits for a worker that runs kpool.stress(); SIGINT
    raises KeyboardInterrupt in main, and the interpreter's exit cancels the
    run instead of waiting for it: the process ends within seconds."""
    start = {
        "thread": "t = threading.Thread(target=kpool.stress, args=('mixed',), kwargs=dict(threads=2, ops=%d))\n"
                  "t.start()\nwait = t.join" % LONG,
        "daemon": "t = threading.Thread(target=kpool.stress, args=('mixed',), kwargs=dict(threads=2, ops=%d),"
                  " daemon=True)\nt.start()\nwait = t.join" % LONG,
        # ThreadPoolExecutor imported after kpool: its exit hook (which joins
        # the workers) runs before kpool's
        "executor": "from concurrent.futures import ThreadPoolExecutor\nex = ThreadPoolExecutor(1)\n"
                    "wait = ex.submit(kpool.stress, 'mixed', threads=2, ops=%d).result" % LONG,
        "executor-first": "ex = ThreadPoolExecutor(1)\n"
                          "wait = ex.submit(kpool.stress, 'mixed', threads=2, ops=%d).result" % LONG,
    }[how]
    code = ("import os, signal, sys, threading, time\n"
            + ("from concurrent.futures import ThreadPoolExecutor\n" if how == "executor-first" else "")
            + "import kpool\n" + start + "\n"
            + "time.sleep(0.3)\n"
              "threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()\n"
              "print('waiting', flush=True)\n"
              "wait()\n"
              "print('not interrupted', flush=True)\n")
    t0 = time.monotonic()
    proc = run_python(code, timeout=120, expect_rc=None)
    wall = time.monotonic() - t0
    assert "waiting" in proc.stdout and "not interrupted" not in proc.stdout, (proc.stdout, proc.stderr)
    assert "KeyboardInterrupt" in proc.stderr, proc.stderr
    assert proc.returncode in (-signal.SIGINT, 128 + signal.SIGINT), (proc.returncode, proc.stderr)
    assert wall < 20, wall


# Reads SIGINT's C-level disposition in a child interpreter (glibc x86-64
# and aarch64 struct sigaction: the handler first, sa_flags after the
# 128-byte mask).
SIGACTION_HELPERS = """
import ctypes, signal, time
libc = ctypes.CDLL(None, use_errno=True)
def c_sigaction():
    act = ctypes.create_string_buffer(512)
    assert libc.sigaction(signal.SIGINT, None, act) == 0
    return act
def c_handler():
    return ctypes.c_void_p.from_buffer(c_sigaction()).value
def c_flags():
    return ctypes.c_int.from_buffer(c_sigaction(), 8 + 128).value
def wait_for_a_change(before, seconds=30):
    t0 = time.monotonic()
    while c_handler() == before:
        assert time.monotonic() - t0 < seconds, "kpool's handler never came"
        time.sleep(0.005)
import threading, kpool
python_c = c_handler()
def run_in_a_thread():
    # a long kpool.stress() run in a thread, once kpool's handler is in
    # front: (the Event that stops it, the thread)
    stop = threading.Event()
    t = threading.Thread(target=kpool.stress, args=('mixed',), kwargs=dict(threads=1, ops=%d, cancel=stop))
    t.start()
    wait_for_a_change(python_c)
    return stop, t
""" % LONG


@pytest.mark.parametrize("caught", [False, True])
def test_sigint_stops_a_worker_run_inside_with_executor(caught):
    """The common form: `with ThreadPoolExecutor()` around a worker's run.
    KeyboardInterrupt leaves the with block, whose exit joins the worker;
    Ctrl-C has cancelled the run, so the join is prompt. Caught, the
    worker's result says how the run ended."""
    code = SIGACTION_HELPERS + f"""
import os
from concurrent.futures import ThreadPoolExecutor
t0 = time.monotonic()
try:
    with ThreadPoolExecutor(1) as ex:
        f = ex.submit(kpool.stress, 'mixed', threads=2, ops={4 * LONG})   # a minute or more uncancelled
        wait_for_a_change(python_c)            # the run is in progress (a loaded machine may be slow to start it)
        threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT)).start()
        print('waiting', flush=True)
        f.result()
    print('not interrupted', flush=True)
except KeyboardInterrupt:
    if not {caught}:
        raise
    r = f.result()
    print('caught', r['stopped'], r['stop_reason'], 0 < r['ops'] < r['ops_requested'],
          time.monotonic() - t0 < 20, flush=True)
r = kpool.stress('pairs', threads=1, ops=1000)
print('next', r['stopped'], r['ops'], flush=True)
"""
    t0 = time.monotonic()
    proc = run_python(code, timeout=300, expect_rc=0 if caught else None)
    assert time.monotonic() - t0 < 20
    assert "waiting" in proc.stdout and "not interrupted" not in proc.stdout, (proc.stdout, proc.stderr)
    if caught:
        assert "caught True cancel True True" in proc.stdout, proc.stdout
        assert "next False 1000" in proc.stdout
    else:
        assert "KeyboardInterrupt" in proc.stderr, proc.stderr
        assert proc.returncode in (-signal.SIGINT, 128 + signal.SIGINT), (proc.returncode, proc.stderr)


def test_sigint_under_a_handler_of_the_programs_own_leaves_runs_alone():
    """kpool cancels runs on SIGINT only while Python's default handler is
    installed: a program that handles SIGINT itself keeps its runs."""
    code = f"""
        import os, signal, threading, kpool
        got = []
        signal.signal(signal.SIGINT, lambda *a: got.append(1))
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
        r = kpool.stress('mixed', threads=2, ops={LONG}, duration=1.0)
        print(len(got), r['stopped'], r['stop_reason'], flush=True)
    """
    proc = run_python(code, timeout=120)
    assert proc.stdout.split() == ["1", "True", "duration"], (proc.stdout, proc.stderr)


def test_the_sigint_handler_is_kpools_only_while_a_run_is_in_progress():
    """The C-level SIGINT handler: Python's before, kpool's during a run (in
    front of Python's), Python's again after the last run ends."""
    code = SIGACTION_HELPERS + f"""
stop, t = run_in_a_thread()
during = c_handler()
stop.set()
t.join()
print(during != python_c, c_handler() == python_c, signal.getsignal(signal.SIGINT) is signal.default_int_handler)
"""
    proc = run_python(code, timeout=120)
    assert proc.stdout.split() == ["True", "True", "True"], (proc.stdout, proc.stderr)


def test_sigint_reaches_a_run_started_after_python_put_its_handler_back():
    """A run in progress; the program sets a handler of its own and then
    Python's default again (asyncio.run does the like): kpool's handler is
    gone, and a run started after that must put it back in front."""
    code = SIGACTION_HELPERS + f"""
import os
stop_a, a = run_in_a_thread()
signal.signal(signal.SIGINT, lambda *args: None)
signal.signal(signal.SIGINT, signal.default_int_handler)
assert c_handler() == python_c
results = []
b = threading.Thread(target=lambda: results.append(kpool.stress('mixed', threads=1, ops={LONG}, duration=60)))
b.start()
wait_for_a_change(python_c)
try:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)
except KeyboardInterrupt:
    pass
b.join(30)
stop_a.set()
a.join()
print(not b.is_alive() and results[0]['stop_reason'], c_handler() == python_c)
"""
    proc = run_python(code, timeout=120)
    assert proc.stdout.split() == ["cancel", "True"], (proc.stdout, proc.stderr)


def test_a_child_forked_during_a_run_gets_pythons_handler_back():
    code = SIGACTION_HELPERS + f"""
import os
stop, t = run_in_a_thread()
pid = os.fork()
if pid == 0:
    os._exit(0 if c_handler() == python_c else 1)
_, status = os.waitpid(pid, 0)
stop.set()
t.join()
print(os.waitstatus_to_exitcode(status), c_handler() == python_c)
"""
    proc = run_python(code, timeout=120)
    assert proc.stdout.split()[-2:] == ["0", "True"], (proc.stdout, proc.stderr)


@pytest.mark.parametrize("restart", [False, True])
def test_kpools_handler_keeps_sa_restart(restart):
    """signal.siginterrupt() before a run (and during it) decides whether
    system calls interrupted by SIGINT restart; kpool's handler in front
    keeps that, and gives it back."""
    code = SIGACTION_HELPERS + f"""
SA_RESTART = 0x10000000
signal.siginterrupt(signal.SIGINT, not {restart})
flags_before = c_flags() & SA_RESTART
stop, t = run_in_a_thread()
flags_during = c_flags() & SA_RESTART
signal.siginterrupt(signal.SIGINT, {restart})      # flipped during the run
stop.set()
t.join()
print(bool(flags_before), bool(flags_during), bool(c_flags() & SA_RESTART), c_handler() == python_c)
"""
    proc = run_python(code, timeout=120)
    assert proc.stdout.split() == [str(restart), str(restart), str(not restart), "True"], (proc.stdout, proc.stderr)


def test_stress_cancel_with_nothing_running():
    assert kpool.stress_cancel() == 0
