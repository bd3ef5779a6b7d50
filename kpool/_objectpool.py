"""kpool.ObjectPool: reuse of expensive Python objects.

Pure Python over no C memory: a LIFO list of idle objects, the objects
handed out tracked by identity, one threading.Condition guarding both.
``factory`` and ``reset`` are called without the lock held, so they may take
as long as they like (and may use the pool themselves).

Invariants (under the lock): in_use == objects handed out and not put back;
in_use + creating + resetting <= capacity when bounded (an object being
reset still holds its slot, so no waiter can create a replacement for it);
len(idle) <= max_idle.
"""

import math
import operator
import threading
import time
from contextlib import contextmanager

from ._core import PoolExhausted

__all__ = ["ObjectPool"]

_TIMEOUT_MAX = 1e9  # seconds, as BufferPool.acquire


def _count_arg(value, name, minimum):
    """An int >= minimum (None is the caller's business); TypeError/ValueError."""
    if isinstance(value, float):
        raise TypeError("%s must be an int or None, not float" % name)
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError("%s must be an int or None, not %s" % (name, type(value).__name__)) from None
    if n < minimum:
        raise ValueError("%s must be %s" % (name, "positive" if minimum == 1 else ">= %d" % minimum))
    return n


def _timeout_arg(timeout):
    """None (wait forever) or seconds >= 0 as a float; as BufferPool.acquire."""
    if timeout is None:
        return None
    if not isinstance(timeout, (int, float)):
        raise TypeError("timeout must be a number or None, not %s" % type(timeout).__name__)
    t = float(timeout)
    if math.isnan(t):
        raise ValueError("timeout must not be NaN")
    if t < 0:
        raise ValueError("timeout must not be negative (use None to wait forever)")
    if t > _TIMEOUT_MAX:
        raise OverflowError("timeout value is too large (use None to wait forever)")
    return t


class ObjectPool:
    """ObjectPool(factory, *, reset=None, capacity=None, max_idle=64)

    A pool of reusable Python objects. get() returns an idle object (a hit)
    or a new one from ``factory()`` (a miss); put(obj) calls ``reset(obj)``
    and keeps the object for reuse, up to ``max_idle`` idle objects (more are
    discarded). ``capacity`` bounds the objects handed out at once (None:
    unbounded); at capacity get() raises kpool.PoolExhausted or waits, as
    its timeout says. A factory that raises propagates its exception and
    does not use up capacity; a reset that raises discards the object (it is
    counted in stats()['discarded'] and put() returns normally). Safe to use
    from many threads.
    """

    def __init__(self, factory, *, reset=None, capacity=None, max_idle=64):
        if not callable(factory):
            raise TypeError("factory must be callable, not %s" % type(factory).__name__)
        if reset is not None and not callable(reset):
            raise TypeError("reset must be callable or None, not %s" % type(reset).__name__)
        self._factory = factory
        self._reset = reset
        self._capacity = None if capacity is None else _count_arg(capacity, "capacity", 1)
        self._max_idle = _count_arg(max_idle, "max_idle", 0)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._waiting = 0      # threads waiting in get()
        self._idle = []        # LIFO of idle objects
        self._out = {}         # id(obj) -> [obj, times handed out]
        self._in_use = 0
        self._creating = 0     # factory calls in progress (they hold capacity)
        self._resetting = 0    # reset calls in progress (they hold capacity too)
        self._created = self._hits = self._misses = self._discarded = 0
        self._high_water = self._gets = self._puts = self._waits = self._timeouts = 0
        self._reset_errors = 0

    # -- properties --------------------------------------------------------
    @property
    def capacity(self):
        """Most objects handed out at once, or None when unbounded."""
        return self._capacity

    @property
    def max_idle(self):
        """Most idle objects kept for reuse."""
        return self._max_idle

    @property
    def in_use(self):
        """Objects handed out by get() and not yet put back."""
        return self._in_use

    @property
    def idle(self):
        """Objects kept for reuse."""
        return len(self._idle)

    # -- get / put ---------------------------------------------------------
    # The common paths take the plain lock once (a C-level context manager);
    # the Condition on the same lock is used only when someone must wait,
    # and notified only when someone waits.

    def get(self, timeout=0.0):
        """Return an object from the pool (an idle one, else a new one).

        timeout 0 raises kpool.PoolExhausted at once when ``capacity``
        objects are handed out; None waits until one is put back; a positive
        number waits at most that many seconds.
        """
        if timeout.__class__ is not float or timeout != 0.0:
            timeout = _timeout_arg(timeout)
        with self._lock:
            if self._idle:
                obj = self._idle.pop()
                self._hits += 1
                self._hand_out_locked(obj)
                return obj
            if self._capacity is None or self._in_use + self._creating + self._resetting < self._capacity:
                self._creating += 1
            else:
                obj = self._wait_locked(timeout)
                if obj is not None:
                    return obj
        try:
            obj = self._factory()
        except BaseException:
            with self._lock:
                self._creating -= 1
                if self._waiting:
                    self._cond.notify()
            raise
        with self._lock:
            self._creating -= 1
            self._created += 1
            self._misses += 1
            self._hand_out_locked(obj)
        return obj

    def _hand_out_locked(self, obj):
        """Record obj as handed out. REQUIRES: the lock held."""
        entry = self._out.get(id(obj))
        if entry is None:
            self._out[id(obj)] = [obj, 1]
        else:
            entry[1] += 1
        self._in_use += 1
        self._gets += 1
        if self._in_use > self._high_water:
            self._high_water = self._in_use

    def _wait_locked(self, timeout):
        """At capacity: wait for an idle object (returned, handed out) or for
        room to create one (None returned, a creation slot taken); raise
        PoolExhausted when timeout says so. REQUIRES: the lock held."""
        if timeout == 0:
            raise PoolExhausted("ObjectPool exhausted: all %d objects are in use" % self._capacity)
        self._waits += 1
        deadline = None if timeout is None else time.monotonic() + timeout
        self._waiting += 1
        try:
            while True:
                if deadline is None:
                    self._cond.wait()
                else:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        self._timeouts += 1
                        raise PoolExhausted(
                            "ObjectPool exhausted: all %d objects are in use (timed out waiting)" % self._capacity)
                    self._cond.wait(left)
                if self._idle:
                    obj = self._idle.pop()
                    self._hits += 1
                    self._hand_out_locked(obj)
                    return obj
                if self._in_use + self._creating + self._resetting < self._capacity:
                    self._creating += 1
                    return None
        finally:
            self._waiting -= 1

    def put(self, obj):
        """Give obj back: reset(obj) is called and the object kept for reuse.

        An object that was not handed out by this pool (or was put back
        already) raises ValueError.
        """
        reset = self._reset
        with self._lock:
            entry = self._out.get(id(obj))
            if entry is None or entry[0] is not obj:
                raise ValueError("object did not come from this ObjectPool (or was already put back)")
            entry[1] -= 1
            if entry[1] == 0:
                del self._out[id(obj)]
            self._in_use -= 1
            self._puts += 1
            if reset is None:
                if len(self._idle) < self._max_idle:
                    self._idle.append(obj)
                else:
                    self._discarded += 1
                if self._waiting:
                    self._cond.notify()
                return
            self._resetting += 1         # the slot stays taken until reset is done
        keep = True
        try:
            reset(obj)
        except Exception:
            keep = False
        with self._lock:
            self._resetting -= 1
            if keep and len(self._idle) < self._max_idle:
                self._idle.append(obj)
            else:
                self._discarded += 1
                if not keep:
                    self._reset_errors += 1
            if self._waiting:
                self._cond.notify()

    @contextmanager
    def borrow(self, timeout=0.0):
        """Context manager: get() an object and put() it back on exit."""
        obj = self.get(timeout)
        try:
            yield obj
        finally:
            self.put(obj)

    def clear(self):
        """Drop every idle object (they count as discarded); returns how many."""
        with self._lock:
            n = len(self._idle)
            self._idle.clear()
            self._discarded += n
            return n

    def stats(self):
        """A dict: created, hits, misses, discarded, high_water, in_use, idle,
        capacity, max_idle, gets, puts, waits, timeouts, reset_errors."""
        with self._lock:
            return {
                "created": self._created,
                "hits": self._hits,
                "misses": self._misses,
                "discarded": self._discarded,
                "high_water": self._high_water,
                "in_use": self._in_use,
                "idle": len(self._idle),
                "capacity": self._capacity,
                "max_idle": self._max_idle,
                "gets": self._gets,
                "puts": self._puts,
                "waits": self._waits,
                "timeouts": self._timeouts,
                "reset_errors": self._reset_errors,
                "resetting": self._resetting,
            }

    def __repr__(self):
        return "<kpool.ObjectPool factory=%r, in_use=%d, idle=%d, capacity=%s>" % (
            self._factory, self._in_use, len(self._idle), self._capacity)


ObjectPool.__module__ = "kpool"
