"""kpool.Block as a fixed-size bytearray (issue 15): b[i], slices read and
written, len() and bytes(), weak references, resize() of heap blocks, the
same rules for released blocks, and MemoryError messages that name the size."""
import gc
import sys
import weakref

import pytest

from conftest import kpool, run_python

KINDS = ["heap", "pool", "arena"]


@pytest.fixture(params=KINDS)
def make(request):
    """make(n) -> a Block of n bytes of the kind under test (and keeps its owner alive)."""
    owners = []

    def make(n):
        if request.param == "heap":
            return kpool.malloc(n)
        if request.param == "pool":
            pool = kpool.BufferPool(n)
            owners.append(pool)
            return pool.acquire()
        arena = kpool.Arena()
        owners.append(arena)
        return arena.alloc(n)

    make.kind = request.param
    return make


def fill(b, data):
    memoryview(b)[:] = data
    return b


# ---- reading -------------------------------------------------------------------------

def test_index_reads_an_int(make):
    b = fill(make(8), bytes(range(10, 18)))
    assert b[0] == 10 and b[7] == 17
    assert b[-1] == 17 and b[-8] == 10
    assert isinstance(b[3], int)


def test_index_out_of_range_is_index_error(make):
    b = make(8)
    for i in (8, 9, -9, 1 << 62, -(1 << 62)):
        with pytest.raises(IndexError):
            b[i]
    with pytest.raises(IndexError):
        b[1 << 100]
    if make.kind != "pool":                    # a BufferPool's buffers have at least 1 byte
        with pytest.raises(IndexError):
            make(0)[0]


def test_wrong_index_type_is_type_error(make):
    b = make(8)
    for key in ("1", 1.0, None, (1, 2), b"x"):
        with pytest.raises(TypeError):
            b[key]
        with pytest.raises(TypeError):
            b[key] = 1


def test_index_objects_are_accepted(make):
    np = pytest.importorskip("numpy")
    b = fill(make(4), b"abcd")

    class Idx:
        def __index__(self):
            return 2

    assert b[Idx()] == ord("c")
    assert b[np.int64(1)] == ord("b")
    assert b[True] == ord("b")


def test_slices_read_bytes_like_bytearray(make):
    data = bytes(range(50, 82))
    b = fill(make(len(data)), data)
    ref = bytearray(data)
    for s in (slice(None), slice(0, 5), slice(5, 0), slice(-5, None), slice(None, -30), slice(3, 100),
              slice(None, None, 2), slice(None, None, -1), slice(30, 2, -3), slice(1, 31, 7), slice(100, 200),
              slice(-100, 3), slice(None, None, 1 << 62), slice(-1, -40, -2)):
        got = b[s]
        assert type(got) is bytes
        assert got == bytes(ref[s]), s


def test_len_and_bytes(make):
    b = fill(make(5), b"hello")
    assert len(b) == 5 == b.size
    assert bytes(b) == b"hello"
    assert bytearray(b) == bytearray(b"hello")
    assert list(b) == list(b"hello")          # iteration through b[i]
    assert b"".join(bytes([x]) for x in reversed(b)) == b"olleh"
    if make.kind != "pool":
        assert len(make(0)) == 0 and bytes(make(0)) == b""


# ---- writing ---------------------------------------------------------------------------

def test_index_write(make):
    b = fill(make(4), b"abcd")
    b[0] = 65
    b[-1] = 0x5A
    b[1] = True
    assert bytes(b) == b"A\x01cZ"
    with pytest.raises(ValueError):
        b[0] = 256
    with pytest.raises(ValueError):
        b[0] = -1
    with pytest.raises(ValueError):
        b[0] = 1 << 80
    for bad in ("A", b"A", 1.0, None):
        with pytest.raises(TypeError):
            b[0] = bad
    with pytest.raises(IndexError):
        b[4] = 1
    assert bytes(b) == b"A\x01cZ"


def test_slice_write_of_equal_length(make):
    b = fill(make(8), b"........")
    b[0:3] = b"abc"
    b[-2:] = bytearray(b"YZ")
    b[3:5] = memoryview(b"de")
    assert bytes(b) == b"abcde.YZ"
    b[::2] = b"1234"
    assert bytes(b) == b"1b2d3.4Z"
    b[::-1] = b"ABCDEFGH"
    assert bytes(b) == b"HGFEDCBA"
    b[1:7:3] = [0x30, 0x31]                    # an iterable of ints, as bytearray takes
    assert bytes(b) == b"H0FE1CBA"
    b[2:2] = b""
    assert bytes(b) == b"H0FE1CBA"


def test_slice_write_from_other_buffers(make):
    np = pytest.importorskip("numpy")
    b = make(8)
    b[:] = np.arange(2, dtype=np.uint32)       # 8 bytes of any format
    assert bytes(b) == np.arange(2, dtype=np.uint32).tobytes()
    strided = memoryview(bytes(range(16)))[::2]  # not contiguous
    b[:] = strided
    assert bytes(b) == bytes(range(0, 16, 2))
    other = fill(kpool.malloc(8), b"12345678")
    b[:] = other
    assert bytes(b) == b"12345678"


def test_slice_write_from_itself_overlapping(make):
    b = fill(make(8), b"abcdefgh")
    m = memoryview(b)
    b[2:8] = m[0:6]
    assert bytes(b) == b"ababcdef"
    b[::2] = m[0:4]                            # extended slice from an overlapping view
    assert bytes(b) == b"abbbadbf"             # bytearray's answer: the value as it was before
    m.release()


def test_slice_write_cannot_change_the_size(make):
    b = fill(make(6), b"abcdef")
    for s, v in ((slice(0, 3), b"xy"), (slice(0, 3), b"wxyz"), (slice(None), b""), (slice(None, None, 2), b"xy"),
                 (slice(4, 2), b"x")):
        with pytest.raises(ValueError, match="cannot change size"):
            b[s] = v
    assert bytes(b) == b"abcdef" and len(b) == 6


def test_slice_write_bad_values_are_type_errors(make):
    b = make(4)
    for bad in ("abcd", 4, 1.5, None, object()):
        with pytest.raises(TypeError):
            b[:] = bad
    with pytest.raises(ValueError):
        b[:] = [1, 2, 3, 300]


def test_delete_is_refused(make):
    b = fill(make(4), b"abcd")
    with pytest.raises(TypeError):
        del b[0]
    with pytest.raises(TypeError):
        del b[0:2]
    assert bytes(b) == b"abcd"


def test_writes_are_visible_through_views_and_numpy(make):
    np = pytest.importorskip("numpy")
    b = make(16)
    arr = np.frombuffer(b, dtype=np.uint8)
    b[3] = 99
    b[8:12] = b"\x01\x02\x03\x04"
    assert arr[3] == 99 and list(arr[8:12]) == [1, 2, 3, 4]
    del arr


# ---- released and reset blocks ---------------------------------------------------------

def test_released_block_refuses_every_operation(make):
    b = make(8)
    b.release()
    for op in (lambda: b[0], lambda: b[0:2], lambda: b.__setitem__(0, 1), lambda: b.__setitem__(slice(0, 1), b"x"),
               lambda: len(b), lambda: bytes(b), lambda: list(b), lambda: b.resize(4)):
        with pytest.raises(ValueError, match="released"):
            op()


def test_reset_arena_block_refuses_indexing():
    a = kpool.Arena()
    b = a.alloc(8)
    a.reset()
    for op in (lambda: b[0], lambda: b[1:], lambda: b.__setitem__(0, 1), lambda: len(b), lambda: bytes(b)):
        with pytest.raises(ValueError, match="reset"):
            op()


def test_index_that_releases_the_block_is_caught(make):
    """__index__ runs Python code in the middle of b[i]: the block is checked after it."""
    b = make(8)

    class Sneaky:
        def __index__(self):
            b.release()
            return 0

    with pytest.raises(ValueError):
        b[Sneaky()]
    b = make(8)
    with pytest.raises(ValueError):
        b[Sneaky()] = 1
    b = make(8)
    with pytest.raises(ValueError):
        b[Sneaky():4]
    b = make(8)
    with pytest.raises(ValueError):
        b[:Sneaky()] = b""


# ---- weak references --------------------------------------------------------------------

def test_weak_references(make):
    b = make(8)
    r = weakref.ref(b)
    assert r() is b
    called = []
    r2 = weakref.ref(b, lambda ref: called.append(ref))
    p = weakref.proxy(b)
    assert len(p) == 8
    d = weakref.WeakValueDictionary(x=b)
    assert d["x"] is b
    del b
    gc.collect()
    assert r() is None and r2() is None and called == [r2]
    assert "x" not in d
    with pytest.raises(ReferenceError):
        len(p)


def test_weak_reference_callback_may_allocate():
    """A weakref callback runs while the Block dies; it may use the pool at once."""
    pool = kpool.BufferPool(64)
    got = []
    b = pool.acquire()
    r = weakref.ref(b, lambda ref: got.append(pool.acquire()))
    del b
    assert r() is None and len(got) == 1 and got[0].size == 64
    got[0].release()
    assert pool.in_use == 0


# ---- resize ------------------------------------------------------------------------------

@pytest.mark.parametrize("old,new", [(10, 100), (100, 10), (8, 8), (0, 64), (64, 0), (100, 1 << 20),
                                     (3 << 20, 100), (1 << 20, 5 << 20)])
def test_resize_keeps_the_prefix(old, new):
    b = kpool.malloc(old)
    data = bytes((i * 7) & 0xFF for i in range(old))
    b[:] = data
    b.resize(new)
    assert b.size == new == len(b)
    assert b.usable_size >= new
    keep = min(old, new)
    assert bytes(b)[:keep] == data[:keep]
    if new:
        b[new - 1] = 1
        assert b[-1] == 1
    b.release()


def test_resize_moves_the_accounting(no_leak):
    b = kpool.malloc(100)
    b.resize(1 << 20)
    b.resize(300)
    del b


def test_resize_keeps_bytes_requested_exact():
    """Block.resize's docstring: bytes_requested moves by the size change
    exactly (kp_realloc_sized), in place, moved, small to large and back, to
    0; requested_exact stays True. In a fresh interpreter, whose figure is
    exact to begin with."""
    proc = run_python("""
        import kpool
        a = kpool.stats()
        assert a["requested_exact"], a
        b = kpool.malloc(40)
        for n in (44, 500, 300000, 1000, 0, 7):      # kept, moved, large, small again, empty, small
            b.resize(n)
            s = kpool.stats()
            assert s["bytes_requested"] - a["bytes_requested"] == n, (n, s["bytes_requested"] - a["bytes_requested"])
            assert s["requested_exact"], n
        b.release()
        assert kpool.stats()["bytes_requested"] == a["bytes_requested"]
        print("ok")
        """)
    assert proc.stdout.strip() == "ok", proc.stdout + proc.stderr


def test_resize_refused_while_a_view_is_alive():
    b = kpool.malloc(16)
    m = memoryview(b)
    with pytest.raises(BufferError):
        b.resize(32)
    assert b.size == 16
    m.release()
    b.resize(32)
    assert b.size == 32


@pytest.mark.parametrize("bad,exc", [(-1, ValueError), (-(1 << 70), ValueError), (1 << 64, OverflowError),
                                     (1 << 63, OverflowError), ((1 << 63) - 1, MemoryError),
                                     ("10", TypeError), (1.0, TypeError), (None, TypeError)])
def test_resize_bad_sizes(bad, exc):
    b = kpool.malloc(16)
    b[:] = b"x" * 16
    with pytest.raises(exc):
        b.resize(bad)
    assert bytes(b) == b"x" * 16


def test_resize_failure_names_the_size_and_keeps_the_block():
    b = kpool.malloc(16)
    b[:] = b"y" * 16
    with pytest.raises(MemoryError, match=str(1 << 50)):
        b.resize(1 << 50)
    assert b.size == 16 and bytes(b) == b"y" * 16


def test_resize_of_pool_and_arena_blocks_is_refused():
    pool = kpool.BufferPool(64)
    pb = pool.acquire()
    with pytest.raises(TypeError, match="BufferPool"):
        pb.resize(32)
    with pytest.raises(TypeError, match="BufferPool"):
        pb.resize(128)
    assert pb.size == 64
    a = kpool.Arena()
    ab = a.alloc(64)
    with pytest.raises(TypeError, match="Arena"):
        ab.resize(32)
    assert ab.size == 64


def test_resize_argument_errors():
    b = kpool.malloc(8)
    with pytest.raises(TypeError):
        b.resize()
    with pytest.raises(TypeError):
        b.resize(1, 2)


# ---- MemoryError messages ---------------------------------------------------------------

def test_malloc_memory_error_names_the_size():
    with pytest.raises(MemoryError) as e:
        kpool.malloc(1 << 40)
    assert str(e.value) == "kpool.malloc: cannot allocate 1099511627776 bytes"
    with pytest.raises(MemoryError, match="cannot allocate 1099511627776 bytes"):
        kpool.malloc(1 << 40, zero=True)


def test_arena_memory_error_names_the_size():
    with pytest.raises(MemoryError, match="Arena.alloc: cannot allocate 1125899906842624 bytes"):
        kpool.Arena().alloc(1 << 50)


# ---- spare wrappers: Block objects are reused safely -------------------------------------

def test_a_reused_wrapper_is_a_fresh_block():
    pool = kpool.BufferPool(64)
    ids = set()
    for i in range(10):
        b = pool.acquire()
        assert not b.released and b.size == 64 and b.kind == "pool"
        b[0] = i
        ids.add(id(b))
        b.release()
        assert b.released
    assert pool.in_use == 0
    h = kpool.malloc(10)
    r = weakref.ref(h)
    del h
    h2 = kpool.malloc(20)                      # may reuse the dead wrapper's memory
    assert r() is None and h2.size == 20 and len(h2) == 20
    assert weakref.ref(h2)() is h2


def test_pool_dies_with_its_spare_wrapper(no_leak):
    """A pool frees the spare wrapper it holds: no Python object memory leaks."""
    def cycle():
        pool = kpool.BufferPool(128)
        b = pool.acquire()
        del b                                  # its memory becomes the pool's spare
        del pool

    for _ in range(100):
        cycle()
    gc.collect()
    before = sys.getallocatedblocks()
    for _ in range(2000):
        cycle()
    gc.collect()
    assert sys.getallocatedblocks() - before < 100


@pytest.mark.parametrize("kind", ["pool", "heap"])
def test_a_dead_wrappers_memory_is_kept_for_the_next_block(kind):
    """Issue 15 item 6: acquire()/malloc() reuse the object memory of a Block
    that died after release instead of allocating a new object. Python
    objects of every small size made in between cannot take that memory (it
    is not back in Python's allocator), so the next Block lands on it."""
    pool = kpool.BufferPool(64)
    new = pool.acquire if kind == "pool" else (lambda: kpool.malloc(64))
    for _ in range(20):
        b = new()
        where = id(b)
        b.release()
        del b
        junk = [bytes(k) for k in range(1, 160)] + [object() for _ in range(50)]
        b = new()
        assert id(b) == where
        b.release()
        del b, junk
    assert pool.in_use == 0
