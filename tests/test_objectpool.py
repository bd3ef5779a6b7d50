"""kpool.ObjectPool: reuse, reset, capacity and timeouts, identity
tracking, discarded objects, factory errors, threads, bad input."""
import threading
import time

import pytest

from conftest import kpool, run_python


def test_get_put_reuses_objects():
    pool = kpool.ObjectPool(list)
    a = pool.get()
    assert a == [] and pool.in_use == 1
    pool.put(a)
    assert pool.in_use == 0 and pool.idle == 1
    b = pool.get()
    assert b is a
    s = pool.stats()
    assert s["created"] == 1 and s["hits"] == 1 and s["misses"] == 1


def test_reset_is_called_on_put():
    pool = kpool.ObjectPool(list, reset=lambda l: l.clear())
    a = pool.get()
    a.extend([1, 2, 3])
    pool.put(a)
    assert pool.get() == []


def test_put_of_foreign_object_is_value_error():
    pool = kpool.ObjectPool(dict)
    with pytest.raises(ValueError):
        pool.put({})
    other = kpool.ObjectPool(dict)
    x = other.get()
    with pytest.raises(ValueError):
        pool.put(x)
    # equal but not identical
    y = pool.get()
    with pytest.raises(ValueError):
        pool.put(dict(y))
    pool.put(y)
    with pytest.raises(ValueError):
        pool.put(y)  # already put back
    other.put(x)


def test_capacity_and_timeout_zero():
    pool = kpool.ObjectPool(object, capacity=2)
    a, b = pool.get(), pool.get()
    with pytest.raises(kpool.PoolExhausted):
        pool.get()
    with pytest.raises(kpool.PoolExhausted):
        pool.get(timeout=0)
    pool.put(a)
    assert pool.get() is a
    pool.put(b)


def test_positive_timeout_waits():
    pool = kpool.ObjectPool(object, capacity=1)
    a = pool.get()
    t0 = time.monotonic()
    with pytest.raises(kpool.PoolExhausted):
        pool.get(timeout=0.2)
    assert time.monotonic() - t0 >= 0.19
    threading.Timer(0.05, pool.put, (a,)).start()
    assert pool.get(timeout=30) is a


def test_none_waits_for_a_put():
    pool = kpool.ObjectPool(bytearray, capacity=1)
    a = pool.get()
    got = []
    t = threading.Thread(target=lambda: got.append(pool.get(timeout=None)))
    t.start()
    time.sleep(0.1)
    assert not got
    pool.put(a)
    t.join(10)
    assert got == [a] and got[0] is a
    assert pool.stats()["waits"] >= 1


def test_borrow_context_manager():
    pool = kpool.ObjectPool(list, reset=list.clear, capacity=1)
    with pool.borrow() as obj:
        obj.append(1)
        assert pool.in_use == 1
    assert pool.in_use == 0 and pool.idle == 1
    with pytest.raises(RuntimeError):
        with pool.borrow() as obj:
            raise RuntimeError
    assert pool.in_use == 0
    with pool.borrow() as obj:
        assert obj == []


def test_factory_error_propagates_and_does_not_use_capacity():
    calls = []

    def factory():
        calls.append(1)
        if len(calls) <= 3:
            raise OSError("no connection")
        return object()

    pool = kpool.ObjectPool(factory, capacity=1)
    for _ in range(3):
        with pytest.raises(OSError):
            pool.get()
    assert pool.in_use == 0
    obj = pool.get()
    assert pool.in_use == 1
    assert pool.stats()["created"] == 1
    pool.put(obj)


def test_reset_that_raises_discards():
    def reset(obj):
        if obj.get("bad"):
            raise RuntimeError("cannot reset")
        obj.clear()

    pool = kpool.ObjectPool(dict, reset=reset)
    a = pool.get()
    a["bad"] = True
    pool.put(a)
    assert pool.idle == 0
    assert pool.stats()["discarded"] == 1
    b = pool.get()
    assert b is not a


def test_max_idle():
    pool = kpool.ObjectPool(object, max_idle=2)
    objs = [pool.get() for _ in range(5)]
    for o in objs:
        pool.put(o)
    assert pool.idle == 2
    assert pool.stats()["discarded"] == 3
    zero = kpool.ObjectPool(object, max_idle=0)
    zero.put(zero.get())
    assert zero.idle == 0


def test_stats_keys():
    pool = kpool.ObjectPool(object, capacity=4)
    xs = [pool.get() for _ in range(3)]
    pool.put(xs.pop())
    s = pool.stats()
    for key in ("created", "hits", "misses", "discarded", "high_water"):
        assert key in s
    assert s["created"] == 3 and s["misses"] == 3 and s["hits"] == 0
    assert s["high_water"] == 3
    assert s["in_use"] == 2 and s["idle"] == 1


def test_threads_share_a_pool():
    pool = kpool.ObjectPool(lambda: [0], capacity=3)
    errors = []
    out = set()
    lock = threading.Lock()

    def worker():
        try:
            for _ in range(300):
                obj = pool.get(timeout=None)
                with lock:
                    assert id(obj) not in out  # never handed to two threads at once
                    out.add(id(obj))
                obj[0] += 1
                with lock:
                    out.discard(id(obj))
                pool.put(obj)
        except BaseException as e:  # pragma: no cover
            errors.append(e)

    ts = [threading.Thread(target=worker) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    s = pool.stats()
    assert s["high_water"] <= 3
    assert s["created"] <= 3
    assert pool.in_use == 0


def test_ctrl_c_interrupts_a_wait():
    proc = run_python(
        """
        import os, signal, threading, kpool
        pool = kpool.ObjectPool(object, capacity=1)
        held = pool.get()
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
        try:
            pool.get(timeout=None)
        except KeyboardInterrupt:
            print('interrupted')
        pool.put(held)
        assert pool.get() is held
        print('OK')
        """, timeout=60)
    assert proc.stdout.split() == ["interrupted", "OK"]


def test_non_callable_factory_is_type_error():
    with pytest.raises(TypeError):
        kpool.ObjectPool(42)
    with pytest.raises(TypeError):
        kpool.ObjectPool(list, reset=42)
    with pytest.raises(TypeError):
        kpool.ObjectPool()


@pytest.mark.parametrize("cap", [0, -1])
def test_bad_capacity_is_value_error(cap):
    with pytest.raises(ValueError):
        kpool.ObjectPool(list, capacity=cap)


def test_bad_argument_types():
    with pytest.raises(TypeError):
        kpool.ObjectPool(list, capacity="2")
    with pytest.raises(TypeError):
        kpool.ObjectPool(list, capacity=2.0)
    with pytest.raises(TypeError):
        kpool.ObjectPool(list, max_idle=None)
    with pytest.raises(ValueError):
        kpool.ObjectPool(list, max_idle=-1)
    with pytest.raises(TypeError):
        kpool.ObjectPool(list, 3)  # keyword-only options


@pytest.mark.parametrize("timeout", [-1, -0.5, float("nan")])
def test_bad_timeout_is_value_error(timeout):
    pool = kpool.ObjectPool(list)
    with pytest.raises(ValueError):
        pool.get(timeout)


def test_timeout_wrong_type_and_huge():
    pool = kpool.ObjectPool(list, capacity=1)
    with pytest.raises(TypeError):
        pool.get("1")
    with pytest.raises(OverflowError):
        pool.get(timeout=1e300)
    assert pool.in_use == 0


def test_capacity_holds_while_reset_runs():
    """Issue 15: put() used to lower in_use and wake a waiter before reset()
    finished; the waiter created a new object and the reset one then went to
    the idle list, so more than `capacity` objects existed and were handed out.
    An object being reset still holds its capacity slot."""
    cap, nthreads, rounds = 3, 8, 60
    pool = kpool.ObjectPool(lambda: [0], reset=lambda o: time.sleep(0.0005), capacity=cap)
    errors, peaks = [], []
    lock = threading.Lock()
    out = set()

    def worker():
        try:
            for _ in range(rounds):
                with pool.borrow(timeout=None) as obj:
                    s = pool.stats()
                    with lock:
                        assert id(obj) not in out   # never handed to two threads at once
                        out.add(id(obj))
                        peaks.append((s["in_use"], s["created"], s["in_use"] + s["resetting"]))
                    assert s["in_use"] <= cap, s
                    assert s["created"] <= cap, s
                    assert s["in_use"] + s["resetting"] <= cap, s
                    time.sleep(0.0002)
                    with lock:
                        out.discard(id(obj))
        except BaseException as e:  # pragma: no cover - the failure is the test's point
            errors.append(e)

    ts = [threading.Thread(target=worker) for _ in range(nthreads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors[0]
    s = pool.stats()
    assert s["created"] <= cap and s["high_water"] <= cap, s
    assert s["in_use"] == 0 and s["resetting"] == 0 and s["idle"] == s["created"]
    assert max(p[0] for p in peaks) <= cap and max(p[1] for p in peaks) <= cap
    assert s["gets"] == nthreads * rounds == s["puts"]
