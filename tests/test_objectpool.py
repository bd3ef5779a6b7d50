"""kpool.ObjectPool: reuse, reset, capacity and timeouts, identity
tracking, discarded objects, factory errors, threads, bad input."""
import re
import threading
import time
import typing
import warnings

import pytest

from conftest import kpool, run_in_threads, run_python


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
    with pytest.warns(RuntimeWarning, match="cannot reset"):
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


def test_with_on_a_closed_pool_is_a_value_error():
    pool = kpool.ObjectPool(list)
    pool.close()
    with pytest.raises(ValueError, match="closed"):
        with pool:
            pass


def test_bad_argument_types():
    with pytest.raises(TypeError, match="capacity must be an int or None, not str"):
        kpool.ObjectPool(list, capacity="2")
    with pytest.raises(TypeError, match="capacity must be an int or None, not float"):
        kpool.ObjectPool(list, capacity=2.0)
    with pytest.raises(TypeError, match="max_idle must be an int, not NoneType"):   # None is not offered
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
    for bad in (True, False):
        with pytest.raises(TypeError, match="timeout"):
            pool.get(bad)
    assert pool.in_use == 0


@pytest.mark.parametrize("at_capacity", [False, True])
def test_borrow_checks_its_timeout_as_get_does(at_capacity):
    """borrow(timeout) used to pass the timeout on unchecked: nan spun
    forever at capacity, -1 raised PoolExhausted, "x" an internal TypeError,
    and below capacity all of them were accepted silently."""
    pool = kpool.ObjectPool(list, capacity=1)
    held = pool.get() if at_capacity else None
    for bad, exc in ((float("nan"), ValueError), (-1, ValueError), ("x", TypeError), (True, TypeError),
                     (1e300, OverflowError), (float("inf"), OverflowError)):
        with pytest.raises(exc):
            with pool.borrow(bad):
                pass
    assert pool.in_use == (1 if at_capacity else 0)
    if held is not None:
        pool.put(held)
    with pool.borrow(0.5) as obj:
        assert obj == []
    assert pool.in_use == 0


def test_timeout_accepts_numpy_numbers():
    np = pytest.importorskip("numpy")
    pool = kpool.ObjectPool(list, capacity=1)
    held = pool.get()
    for zero in (np.int64(0), np.float64(0.0)):
        with pytest.raises(kpool.PoolExhausted):
            pool.get(zero)
    pool.put(held)
    assert pool.get(np.int64(1)) == []


@pytest.mark.parametrize("drop", ["beyond_max_idle", "discard", "failed_reset", "clear"])
def test_capacity_holds_while_close_runs(drop):
    """An object being closed still exists: its capacity slot is freed only
    when close(obj) returns. (It used to be freed first, so with capacity=1
    a second object was created while the first was still open.)"""
    open_now, most_open = set(), [0]
    entered, release = threading.Event(), threading.Event()

    def factory():
        o = object()
        open_now.add(id(o))
        most_open[0] = max(most_open[0], len(open_now))
        return o

    def close(o):
        entered.set()
        release.wait(10)
        open_now.discard(id(o))

    def reset(o):
        if drop == "failed_reset":
            raise RuntimeError("broken")

    pool = kpool.ObjectPool(factory, close=close, reset=reset, capacity=1,
                            max_idle=1 if drop == "clear" else 0)
    a = pool.get()
    action = {"beyond_max_idle": lambda: pool.put(a), "discard": lambda: pool.discard(a),
              "failed_reset": lambda: pool.put(a), "clear": lambda: (pool.put(a), pool.clear())}[drop]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        t = threading.Thread(target=action)
        t.start()
        assert entered.wait(10)
        with pytest.raises(kpool.PoolExhausted):
            pool.get()                      # a is still open: no room
        assert pool.stats()["closing"] == 1
        got = []
        waiter = threading.Thread(target=lambda: got.append(pool.get(timeout=10)))
        waiter.start()                      # waits for the slot, then gets it
        release.set()
        t.join()
        waiter.join()
    assert len(got) == 1 and most_open[0] == 1
    s = pool.stats()
    assert s["closing"] == 0 and s["in_use"] == 1


def test_capacity_holds_while_reset_runs():
    """Issue 15: put() used to lower in_use and wake a waiter before reset()
    finished; the waiter created a new object and the reset one then went to
    the idle list, so more than `capacity` objects existed and were handed out.
    An object being reset still holds its capacity slot."""
    cap, nthreads, rounds = 3, 8, 60
    pool = kpool.ObjectPool(lambda: [0], reset=lambda o: time.sleep(0.0005), capacity=cap)
    peaks = []
    lock = threading.Lock()
    out = set()

    def worker():
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

    run_in_threads(worker, nthreads)
    s = pool.stats()
    assert s["created"] <= cap and s["high_water"] <= cap, s
    assert s["in_use"] == 0 and s["resetting"] == 0 and s["idle"] == s["created"]
    assert max(p[0] for p in peaks) <= cap and max(p[1] for p in peaks) <= cap
    assert s["gets"] == nthreads * rounds == s["puts"]


# -- discard, the close callback, close() (issue 15 item 2) ---------------------


def test_discard_frees_the_slot_and_closes_the_object():
    closed = []
    pool = kpool.ObjectPool(lambda: [0], close=closed.append, capacity=1)
    a = pool.get()
    with pytest.raises(kpool.PoolExhausted):
        pool.get()
    pool.discard(a)
    assert closed == [a] and closed[0] is a
    assert pool.in_use == 0 and pool.idle == 0
    s = pool.stats()
    assert s["discarded"] == 1 and s["puts"] == 0
    b = pool.get()                      # the slot is free again: a new object
    assert b is not a and pool.stats()["created"] == 2
    with pytest.raises(ValueError):
        pool.discard(a)                 # already gone
    with pytest.raises(ValueError):
        pool.put(a)
    with pytest.raises(ValueError):
        pool.discard([0])               # never handed out
    pool.put(b)
    with pytest.raises(ValueError):
        pool.discard(b)                 # idle, not handed out
    assert closed == [a]


def test_discard_wakes_a_waiting_thread():
    pool = kpool.ObjectPool(object, capacity=1)
    a = pool.get()
    got = []
    t = threading.Thread(target=lambda: got.append(pool.get(timeout=30)))
    t.start()
    time.sleep(0.05)
    pool.discard(a)
    t.join(30)
    assert len(got) == 1 and got[0] is not a


def test_discard_inside_borrow_is_not_put_back():
    pool = kpool.ObjectPool(list, reset=list.clear, capacity=2)
    with pool.borrow() as conn:
        pool.discard(conn)
    assert pool.in_use == 0 and pool.idle == 0
    assert pool.stats()["discarded"] == 1 and pool.stats()["puts"] == 0
    with pool.borrow() as other:
        pool.put(other)                 # put back by hand inside: borrow does not put it twice
    assert pool.idle == 1


def test_borrow_does_not_put_back_what_another_user_got_since():
    """Put back inside the block and got again by someone else: the block's
    exit leaves it with them; it is not handed out twice."""
    pool = kpool.ObjectPool(list)
    with pool.borrow() as obj:
        pool.put(obj)
        again = pool.get()
        assert again is obj
    assert pool.in_use == 1 and pool.idle == 0
    other = pool.get()
    assert other is not again           # not handed to two users at once
    pool.put(again)
    pool.put(other)
    assert pool.in_use == 0 and pool.idle == 2


def test_borrow_of_an_object_the_factory_hands_out_twice():
    """A factory that returns one shared object, borrowed twice: put() inside
    takes back the latest hand-out (the inner borrow's), so the inner exit
    puts nothing and the outer exit puts back its own: two puts in all."""
    shared = []
    pool = kpool.ObjectPool(lambda: shared, max_idle=0)
    with pool.borrow() as a:
        with pool.borrow() as b:
            assert a is b is shared and pool.in_use == 2
            pool.put(a)                 # one of the two hand-outs
            assert pool.in_use == 1
        assert pool.in_use == 1         # the inner borrow's was the one put back
    assert pool.in_use == 0 and pool.stats()["puts"] == 2


def test_close_callback_for_every_object_the_pool_drops():
    closed = []

    def reset(o):
        if o.get("bad"):
            raise RuntimeError("broken")

    pool = kpool.ObjectPool(dict, reset=reset, close=lambda o: closed.append(id(o)), max_idle=1)
    a, b, c, d = (pool.get() for _ in range(4))
    pool.put(a)                          # idle
    pool.put(b)                          # beyond max_idle: dropped
    assert closed == [id(b)]
    c["bad"] = True
    with pytest.warns(RuntimeWarning):
        pool.put(c)                      # reset failed: dropped
    assert closed == [id(b), id(c)]
    assert pool.clear() == 1             # a
    assert closed == [id(b), id(c), id(a)]
    e = pool.get()
    pool.put(e)
    pool.close()                         # e, idle
    assert closed == [id(b), id(c), id(a), id(e)]
    pool.put(d)                          # handed out before close: dropped when it comes back
    assert closed[-1] == id(d) and len(closed) == 5
    s = pool.stats()
    assert s["discarded"] == 5 and s["reset_errors"] == 1 and s["idle"] == 0 and s["in_use"] == 0


def test_close_and_context_manager():
    closed = []
    with kpool.ObjectPool(list, close=closed.append) as pool:
        assert not pool.closed
        x = pool.get()
        y = pool.get()
        pool.put(y)
    assert pool.closed and pool.stats()["closed"]
    assert closed == [y]
    with pytest.raises(ValueError, match="closed"):
        pool.get()
    with pytest.raises(ValueError, match="closed"):
        with pool.borrow():
            pass
    pool.close()                          # idempotent
    pool.put(x)                           # still allowed: closes x
    assert closed == [y, x] and pool.idle == 0
    assert "closed" in repr(pool)


def test_close_wakes_waiters_with_a_clear_error():
    pool = kpool.ObjectPool(object, capacity=1)
    held = pool.get()
    errors = []

    def waiter():
        try:
            pool.get(timeout=30)
        except ValueError as e:
            errors.append(e)

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.05)
    pool.close()
    t.join(30)
    assert len(errors) == 1 and "closed" in str(errors[0])
    pool.put(held)


def test_reset_error_warns_once_per_pool_and_is_counted():
    def reset(o):
        raise ValueError("no reset for you")

    pool = kpool.ObjectPool(list, reset=reset)
    objs = [pool.get() for _ in range(3)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for o in objs:
            pool.put(o)                   # put() returns normally
    assert [w.category for w in caught] == [RuntimeWarning]
    assert "no reset for you" in str(caught[0].message) and "reset_errors" in str(caught[0].message)
    assert caught[0].filename == __file__   # points at the put() call
    s = pool.stats()
    assert s["reset_errors"] == 3 and s["discarded"] == 3 and s["idle"] == 0 and s["resetting"] == 0
    other = kpool.ObjectPool(list, reset=reset)
    with pytest.warns(RuntimeWarning):
        other.put(other.get())            # once per pool, not once per process


def test_reset_keyboard_interrupt_releases_the_slot():
    def reset(o):
        raise KeyboardInterrupt

    closed = []
    pool = kpool.ObjectPool(list, reset=reset, close=closed.append, capacity=1)
    a = pool.get()
    with pytest.raises(KeyboardInterrupt):
        pool.put(a)
    s = pool.stats()
    assert s["in_use"] == 0 and s["resetting"] == 0 and s["discarded"] == 1 and closed == [a]
    pool.get()                            # capacity is free again


def test_close_callback_error_is_counted_and_warned_once():
    def close(o):
        raise OSError("close failed")

    pool = kpool.ObjectPool(list, close=close, max_idle=0)
    with pytest.warns(RuntimeWarning, match="close failed"):
        pool.put(pool.get())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pool.discard(pool.get())          # counted, no second warning
    assert pool.stats()["close_errors"] == 2 and pool.stats()["discarded"] == 2


def test_objectpool_is_generic():
    T = typing.TypeVar("T")
    assert issubclass(kpool.ObjectPool, typing.Generic)
    alias = kpool.ObjectPool[bytearray]
    pool = alias(bytearray)
    assert isinstance(pool, kpool.ObjectPool)
    params = kpool.ObjectPool.__parameters__
    assert len(params) == 1
    (t,) = params
    hints = typing.get_type_hints(kpool.ObjectPool.get)
    assert hints["return"] is t
    assert typing.get_type_hints(kpool.ObjectPool.put)["obj"] is t
    assert typing.get_type_hints(kpool.ObjectPool.discard)["obj"] is t
    assert typing.get_type_hints(kpool.ObjectPool.get_async)["return"] is t
    assert typing.get_type_hints(kpool.ObjectPool.borrow.__wrapped__)["return"] == typing.Iterator[t]
    assert typing.get_type_hints(kpool.ObjectPool.borrow_async.__wrapped__)["return"] == typing.AsyncIterator[t]
    assert typing.get_type_hints(kpool.ObjectPool.__init__)["factory"] == typing.Callable[[], t]
    del T


def test_objectpool_types_check_with_mypy(tmp_path):
    """A type checker sees ObjectPool[T]: get() -> T, borrow() yields T."""
    api = pytest.importorskip("mypy.api")
    src = tmp_path / "use_pool.py"
    src.write_text(
        "import kpool\n"
        "pool = kpool.ObjectPool(bytearray, reset=lambda b: b.clear(), capacity=2)\n"
        "reveal_type(pool)\n"
        "reveal_type(pool.get())\n"
        "with pool.borrow() as b:\n"
        "    reveal_type(b)\n"
        "async def f() -> None:\n"
        "    reveal_type(await pool.get_async())\n"
        "    async with pool.borrow_async() as c:\n"
        "        reveal_type(c)\n"
        "n: int = pool.get()\n")
    out, err, rc = api.run([str(src), "--no-incremental", "--cache-dir", str(tmp_path / "cache"),
                            "--python-executable", __import__("sys").executable])
    lines = [l for l in out.splitlines() if "note: Revealed type" in l]
    assert len(lines) == 5, out
    assert re.search(r'ObjectPool\[(builtins\.)?bytearray\]"', lines[0]), out
    assert all(re.search(r'"(builtins\.)?bytearray"', l) for l in lines[1:]), out
    assert 'Incompatible types in assignment (expression has type "bytearray", variable has type "int")' in out


def test_objects_alive_stay_within_capacity_with_discards():
    """discard() and dropped resets free slots, but never let more than
    capacity objects exist at once (created minus dropped)."""
    cap = 3
    pool = kpool.ObjectPool(lambda: [0], reset=lambda o: time.sleep(0.0002), capacity=cap)
    errors = []

    def worker(k):
        try:
            for i in range(80):
                obj = pool.get(timeout=30)
                s = pool.stats()
                alive = s["created"] - s["discarded"]
                assert alive <= cap and s["in_use"] + s["resetting"] <= cap, s
                if (i + k) % 7 == 0:
                    pool.discard(obj)
                else:
                    pool.put(obj)
        except BaseException as e:  # pragma: no cover
            errors.append(e)

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors[0]
    s = pool.stats()
    assert s["created"] - s["discarded"] == s["idle"] <= cap
