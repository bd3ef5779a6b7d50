"""cffi on the same heap: ffi.dlopen(kpool.get_library()) reaches the very
heap the Python API uses (one libkpool.so per process)."""
import re

import pytest

from conftest import kpool

cffi = pytest.importorskip("cffi")


def kpool_cdef():
    """The declarations of kpool.h in a form cffi's parser takes."""
    with open(kpool.get_include() + "/kpool.h") as f:
        text = f.read()
    consts = dict(re.findall(r"#define\s+(KP_STATS_MAX_CLASSES)\s+(\d+)", text))
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"#ifdef __cplusplus.*?#endif", "", text, flags=re.S)
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    text = text.replace("KP_API ", "")
    for k, v in consts.items():
        text = text.replace(k, v)
    return text


_lib = None
_ffi = None


def lib():
    global _lib, _ffi
    if _lib is None:
        _ffi = cffi.FFI()
        _ffi.cdef(kpool_cdef())
        _lib = _ffi.dlopen(kpool.get_library())
    return _ffi, _lib


def test_header_parses_for_cffi():
    ffi, L = lib()
    assert ffi.string(L.kp_version()).decode() == kpool.__version__


def test_block_address_is_owned_by_the_c_heap():
    ffi, L = lib()
    b = kpool.malloc(200)
    p = ffi.cast("void *", b.address)
    assert L.kp_owns(p) == 1
    assert L.kp_owns(ffi.cast("char *", b.address) + 150) == 1  # interior pointer
    assert L.kp_usable_size(p) == b.usable_size
    b.release()


def test_pool_and_arena_blocks_are_owned():
    ffi, L = lib()
    pool = kpool.BufferPool(1000)
    with pool.acquire() as blk:
        assert L.kp_owns(ffi.cast("void *", blk.address)) == 1
    a = kpool.Arena()
    blk = a.alloc(64)
    assert L.kp_owns(ffi.cast("void *", blk.address)) == 1


def test_foreign_memory_is_not_owned():
    ffi, L = lib()
    buf = ffi.new("char[64]")
    assert L.kp_owns(buf) == 0
    x = bytearray(100)
    assert L.kp_owns(ffi.from_buffer(x)) == 0


def test_c_allocations_visible_to_python_stats():
    ffi, L = lib()
    before = kpool.stats()
    ptrs = [L.kp_malloc(1000) for _ in range(50)]
    mid = kpool.stats()
    assert mid["bytes_in_use"] >= before["bytes_in_use"] + 50 * 1000
    assert mid["allocs"] >= before["allocs"] + 50
    for p in ptrs:
        L.kp_free_sized(p, 1000)
    assert kpool.stats()["bytes_in_use"] == before["bytes_in_use"]


def test_memory_written_in_python_read_in_c():
    ffi, L = lib()
    b = kpool.malloc(32)
    memoryview(b)[:] = b"0123456789abcdefghijklmnopqrstuv"
    assert ffi.buffer(ffi.cast("char *", b.address), 32)[:] == bytes(b)
    ffi.memmove(ffi.cast("char *", b.address), b"XYZ", 3)
    assert bytes(b)[:3] == b"XYZ"


def test_kp_stats_get_agrees_with_kpool_stats():
    ffi, L = lib()
    keep = [kpool.malloc(s) for s in range(1, 2000, 13)]
    st = ffi.new("kp_stats *")
    st.struct_size = ffi.sizeof("kp_stats")
    py = kpool.stats()
    assert L.kp_stats_get(st) == 0
    assert st.version == py["version"]
    for key in ("bytes_in_use", "bytes_requested", "bytes_mapped", "bytes_released", "allocs", "frees",
                "tcache_hits", "central_fetches", "pageheap_grows", "lock_contended",
                "lock_wait_ns", "bytes_free_tcaches", "bytes_free_central", "bytes_free_pageheap", "threads"):
        assert getattr(st, key) == py[key], key
    # reading the statistics takes locks of its own
    assert py["lock_acquires"] <= st.lock_acquires <= py["lock_acquires"] + 64
    assert st.internal_fragmentation == pytest.approx(py["internal_fragmentation"])
    assert st.external_fragmentation == pytest.approx(py["external_fragmentation"])
    assert st.nclasses == len(py["classes"])
    c_classes = sorted((st.classes[i].size, st.classes[i].in_use, st.classes[i].allocs, st.classes[i].frees)
                       for i in range(st.nclasses))
    py_classes = [(c["size"], c["in_use"], c["allocs"], c["frees"]) for c in py["classes"]]
    assert c_classes == py_classes
    del keep


def test_kp_stats_get_rejects_short_struct():
    ffi, L = lib()
    st = ffi.new("kp_stats *")
    st.struct_size = 4
    assert L.kp_stats_get(st) == -1
    assert L.kp_stats_get(ffi.NULL) == -1


def test_stats_reset_from_python_seen_in_c():
    ffi, L = lib()
    kpool.malloc(10).release()
    kpool.stats_reset()
    st = ffi.new("kp_stats *")
    st.struct_size = ffi.sizeof("kp_stats")
    L.kp_stats_get(st)
    assert st.allocs == 0 and st.frees == 0


def test_c_realloc_of_memory_and_free():
    ffi, L = lib()
    p = L.kp_malloc(10)
    ffi.memmove(p, b"abcdefghij", 10)
    p = L.kp_realloc(p, 100000)
    assert ffi.buffer(p, 10)[:] == b"abcdefghij"
    assert L.kp_owns(p) == 1
    L.kp_free(p)
