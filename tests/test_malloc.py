"""kpool.malloc and kpool.Block: sizes, bad input, the buffer protocol,
release rules, garbage collection, out of memory."""
import gc
import io
import os
import socket
import sys
import weakref

import pytest

from conftest import bytes_in_use, kpool, run_python


# ---- basics -------------------------------------------------------------------

@pytest.mark.parametrize("size", [0, 1, 7, 8, 16, 100, 1000, 4096, 65536, 300_000, 5 << 20])
def test_malloc_gives_exactly_size_bytes(size):
    b = kpool.malloc(size)
    assert isinstance(b, kpool.Block)
    assert b.size == size
    assert len(b) == size
    assert b.usable_size >= size
    assert b.address % 16 == 0
    assert not b.released
    m = memoryview(b)
    assert m.nbytes == size and not m.readonly and m.format == "B"
    if size > 1:
        m[0] = 0xAB
        m[-1] = 0xCD
        assert m[0] == 0xAB and m[-1] == 0xCD
    m.release()
    b.release()
    assert b.released


def test_malloc_zero_size_blocks_are_distinct():
    blocks = [kpool.malloc(0) for _ in range(100)]
    assert len({b.address for b in blocks}) == 100
    assert bytes(blocks[0]) == b""


def test_zero_true_zeroes():
    dirty = [kpool.malloc(4096) for _ in range(32)]
    for b in dirty:
        memoryview(b)[:] = b"\xff" * 4096
    del dirty
    for _ in range(32):
        b = kpool.malloc(4096, zero=True)
        assert bytes(b) == bytes(4096)
    big = kpool.malloc(3 << 20, zero=True)
    assert memoryview(big).tobytes().count(0) == 3 << 20


def test_live_blocks_never_overlap():
    blocks = [kpool.malloc(s) for s in (range(1, 3000, 7))]
    spans = sorted((b.address, b.address + max(b.size, 1)) for b in blocks)
    for (a0, a1), (b0, _) in zip(spans, spans[1:]):
        assert a1 <= b0


def test_contents_survive_other_allocations():
    blocks = []
    for i in range(500):
        b = kpool.malloc(16 + i)
        memoryview(b)[:] = bytes([i % 251]) * b.size
        blocks.append(b)
    for i, b in enumerate(blocks):
        assert bytes(b) == bytes([i % 251]) * b.size


def test_power_of_two_sizes_are_naturally_aligned():
    for size in (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192):
        bs = [kpool.malloc(size) for _ in range(8)]
        for b in bs:
            assert b.address % size == 0, (size, hex(b.address))


def test_repr_mentions_size_and_state():
    b = kpool.malloc(10)
    assert "size=10" in repr(b)
    b.release()
    assert "released" in repr(b)


# ---- bad input -------------------------------------------------------------------

@pytest.mark.parametrize("bad", ["3", 3.0, 1.5, None, [], b"1", 1j, object()])
def test_malloc_wrong_type_is_type_error(bad):
    with pytest.raises(TypeError):
        kpool.malloc(bad)


@pytest.mark.parametrize("bad", [-1, -100, -(1 << 70)])
def test_malloc_negative_is_value_error(bad):
    with pytest.raises(ValueError):
        kpool.malloc(bad)


def test_malloc_beyond_address_space():
    with pytest.raises(OverflowError):
        kpool.malloc(1 << 70)
    with pytest.raises(OverflowError):
        kpool.malloc(1 << 64)
    with pytest.raises(OverflowError):
        kpool.malloc(1 << 63)                 # the docstring's boundary: not a Py_ssize_t
    with pytest.raises(MemoryError):
        kpool.malloc(sys.maxsize)             # a Py_ssize_t, beyond the address space
    with pytest.raises(MemoryError):
        kpool.malloc(1 << 60)
    with pytest.raises(MemoryError):
        kpool.malloc(1 << 50)
    # and the heap still works
    b = kpool.malloc(100)
    memoryview(b)[:] = b"x" * 100
    assert bytes(b) == b"x" * 100


def test_malloc_accepts_index_objects():
    class Idx:
        def __index__(self):
            return 24

    assert kpool.malloc(Idx()).size == 24
    np = pytest.importorskip("numpy")
    assert kpool.malloc(np.int64(33)).size == 33


def test_malloc_bool_is_an_int():
    # bool is an int subclass: accepted consistently, as size 0 or 1
    assert kpool.malloc(True).size == 1
    assert kpool.malloc(False).size == 0


def test_malloc_argument_errors():
    with pytest.raises(TypeError):
        kpool.malloc()
    with pytest.raises(TypeError):
        kpool.malloc(1, 2)
    with pytest.raises(TypeError):
        kpool.malloc(1, bogus=1)
    with pytest.raises(TypeError):
        kpool.malloc(1, size=1)
    assert kpool.malloc(size=5).size == 5
    assert kpool.malloc(5, zero=1).size == 5


# ---- release rules -----------------------------------------------------------------

def test_release_is_idempotent():
    b = kpool.malloc(64)
    b.release()
    b.release()
    assert b.released


def test_use_after_release_is_value_error():
    b = kpool.malloc(64)
    b.release()
    for attr in ("size", "address", "usable_size"):
        with pytest.raises(ValueError):
            getattr(b, attr)
    with pytest.raises(ValueError):
        memoryview(b)
    with pytest.raises(ValueError):
        len(b)
    with pytest.raises(ValueError):
        bytes(b)
    with pytest.raises(ValueError):
        with b:
            pass
    assert b.released is True


def test_release_while_memoryview_alive_is_buffer_error_and_frees_nothing():
    b = kpool.malloc(256)
    m = memoryview(b)
    m[:5] = b"hello"
    with pytest.raises(BufferError):
        b.release()
    assert not b.released
    assert bytes(m[:5]) == b"hello"
    # a second view, a sliced view, a cast view: all counted
    m2 = memoryview(b)[10:20]
    m.release()
    with pytest.raises(BufferError):
        b.release()
    m2.release()
    c = memoryview(b).cast("I")
    with pytest.raises(BufferError):
        b.release()
    assert c.nbytes == 256
    c.release()
    b.release()
    assert b.released


def test_exit_with_live_view_raises_buffer_error():
    b = kpool.malloc(32)
    with pytest.raises(BufferError):
        with b:
            m = memoryview(b)
    assert not b.released
    m.release()
    b.release()


def test_context_manager_releases():
    with kpool.malloc(100) as b:
        memoryview(b)[0] = 1
        assert not b.released
    assert b.released


def test_bytes_in_use_returns_after_release(no_leak):
    before = kpool.stats()["bytes_in_use"]
    blocks = [kpool.malloc(1000) for _ in range(100)]
    assert kpool.stats()["bytes_in_use"] >= before + 100 * 1000
    for b in blocks:
        b.release()
    assert kpool.stats()["bytes_in_use"] == before


# ---- garbage collection ------------------------------------------------------------

def test_gc_frees_unreferenced_blocks(no_leak):
    before = bytes_in_use()
    for _ in range(200):
        kpool.malloc(5000)
    assert bytes_in_use() == before


def test_gc_keeps_block_alive_while_a_view_exists(no_leak):
    before = bytes_in_use()
    b = kpool.malloc(10000)
    m = memoryview(b)
    r = weakref.ref(b) if hasattr(kpool.Block, "__weakrefoffset__") and kpool.Block.__weakrefoffset__ else None
    del b
    gc.collect()
    assert bytes_in_use() >= before + 10000
    m[:3] = b"abc"
    assert bytes(m[:3]) == b"abc"
    del m, r
    assert bytes_in_use() == before


def test_large_blocks_freed_on_gc(no_leak):
    before = bytes_in_use()
    b = kpool.malloc(64 << 20)
    assert bytes_in_use() >= before + (64 << 20)
    del b
    assert bytes_in_use() == before


# ---- buffer protocol users ----------------------------------------------------------

def test_numpy_frombuffer_is_a_writable_view():
    np = pytest.importorskip("numpy")
    b = kpool.malloc(8 * 100)
    a = np.frombuffer(b, dtype=np.float64)
    assert a.shape == (100,)
    assert a.flags.writeable
    a[:] = np.arange(100)
    assert np.frombuffer(bytes(memoryview(b)), dtype=np.float64)[42] == 42.0
    assert a.ctypes.data == b.address
    with pytest.raises(BufferError):
        b.release()
    del a
    gc.collect()
    b.release()


def test_memoryview_cast():
    b = kpool.malloc(64)
    m = memoryview(b).cast("Q")
    assert len(m) == 8
    m[3] = 2 ** 63
    assert int.from_bytes(bytes(memoryview(b)[24:32]), sys.byteorder) == 2 ** 63
    m.release()


def test_file_readinto(tmp_path):
    data = os.urandom(100_000)
    p = tmp_path / "data.bin"
    p.write_bytes(data)
    b = kpool.malloc(len(data))
    with open(p, "rb") as f:
        assert f.readinto(b) == len(data)
    assert bytes(b) == data
    with open(p, "rb", buffering=0) as f:
        b2 = kpool.malloc(1000)
        assert f.readinto(b2) == 1000
        assert bytes(b2) == data[:1000]
    bio = io.BytesIO(data)
    b3 = kpool.malloc(10)
    assert bio.readinto(b3) == 10 and bytes(b3) == data[:10]
    b.release()


def test_file_write_from_block(tmp_path):
    b = kpool.malloc(5000)
    memoryview(b)[:] = bytes(range(250)) * 20
    p = tmp_path / "out.bin"
    with open(p, "wb") as f:
        assert f.write(b) == 5000
    assert p.read_bytes() == bytes(range(250)) * 20


def test_socket_recv_into_and_send():
    a, c = socket.socketpair()
    try:
        payload = os.urandom(4096)
        src = kpool.malloc(4096)
        memoryview(src)[:] = payload
        a.sendall(src)
        dst = kpool.malloc(4096)
        got = 0
        view = memoryview(dst)
        while got < 4096:
            n = c.recv_into(view[got:])
            assert n > 0
            got += n
        view.release()
        assert bytes(dst) == payload
        dst.release()
    finally:
        a.close()
        c.close()


def test_struct_pack_into():
    import struct

    b = kpool.malloc(16)
    struct.pack_into("<QQ", b, 0, 1, 2)
    assert struct.unpack_from("<QQ", b) == (1, 2)


def test_hashlib_reads_block():
    import hashlib

    b = kpool.malloc(1000, zero=True)
    assert hashlib.sha256(b).hexdigest() == hashlib.sha256(bytes(1000)).hexdigest()


# ---- out of memory --------------------------------------------------------------------

def test_out_of_memory_under_rlimit_as():
    """Under RLIMIT_AS a huge request is MemoryError and the heap keeps working."""
    proc = run_python(
        """
        import resource, kpool
        def vmsize():
            for line in open('/proc/self/status'):
                if line.startswith('VmSize:'):
                    return int(line.split()[1]) * 1024
        limit = vmsize() + (256 << 20)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        small = kpool.malloc(100)
        for size in (1 << 30, 512 << 20, 300 << 20):
            try:
                kpool.malloc(size)
            except MemoryError:
                pass
            else:
                raise SystemExit('malloc(%d) should fail under RLIMIT_AS' % size)
        # exhaust the limit with many medium blocks, then recover
        held = []
        try:
            while True:
                held.append(kpool.malloc(1 << 20))
        except MemoryError:
            pass
        assert len(held) > 10, len(held)
        del held
        kpool.trim()
        for i in range(1000):
            b = kpool.malloc(64 + i)
            memoryview(b)[:4] = b'abcd'
            assert bytes(b)[:4] == b'abcd'
        big = kpool.malloc(64 << 20)
        memoryview(big)[-1] = 7
        # pools and arenas fail cleanly too
        try:
            kpool.BufferPool(1 << 20, prealloc=1000)
        except MemoryError:
            pass
        else:
            raise SystemExit('prealloc of 1000 MiB should fail')
        a = kpool.Arena()
        try:
            a.alloc(1 << 30)
        except MemoryError:
            pass
        else:
            raise SystemExit('arena alloc of 1 GiB should fail')
        assert a.alloc(100).size == 100
        print('OK')
        """)
    assert proc.stdout.strip().endswith("OK")


def test_live_blocks_counts_each_kind_until_release_collect_or_reset():
    """kpool._core.live_blocks(): (heap, pool, arena) Blocks holding memory now;
    a failed malloc or an exhausted pool adds nothing."""
    gc.collect()
    base = kpool._core.live_blocks()

    def delta():
        return tuple(n - b for n, b in zip(kpool._core.live_blocks(), base))

    heap = kpool.malloc(10)
    pool = kpool.BufferPool(64, capacity=1)
    buf = pool.acquire()
    arena = kpool.Arena()
    a1, a2 = arena.alloc(10), arena.alloc(20)
    assert delta() == (1, 1, 2)
    with pytest.raises(MemoryError):
        kpool.malloc(1 << 60)
    with pytest.raises(kpool.PoolExhausted):
        pool.acquire()
    heap.resize(100000)
    assert delta() == (1, 1, 2)
    a1.release()
    assert delta() == (1, 1, 1)
    arena.reset()
    assert delta() == (1, 1, 0)
    buf.release()
    del heap
    gc.collect()
    assert delta() == (0, 0, 0)
    del a2
    pool.close()
