"""Type stubs for kpool._core, the CPython binding of kpool's C allocator.

Everything here is re-exported by the package: use ``import kpool``.
"""

from types import TracebackType
from typing import Any, Dict, Iterable, Iterator, List, Optional, Protocol, Tuple, Type, Union, overload

__version__: str
HAVE_STRESS: int
POOL_MAX_BLOCK: int
POOL_MAX_ALIGN: int
TRACEMALLOC_DOMAIN: int
_FT_MODE: str  # 'gil' or 'free-threaded' (test builds: 'emulated', 'emulated-unlocked')
STRESS_WORKLOADS: Tuple[str, ...]
STRESS_ALLOCATORS: Tuple[str, ...]

class Error(Exception):
    """Base class of kpool's own exceptions."""

class PoolExhausted(Error, TimeoutError):
    """A bounded pool is at its capacity (at once with timeout=0, the
    default of acquire/get, or after a wait of timeout seconds). Also a
    TimeoutError."""

class CorruptionError(Error):
    """The stress driver's verification found damaged or overlapping blocks."""

class Block:
    """A writable buffer of exactly `size` bytes of kpool memory.

    Made by kpool.malloc(), BufferPool.acquire() and Arena.alloc(); supports
    the buffer protocol (bytes(b), memoryview), len(b), indexing like a
    bytearray of fixed size (b[i] -> int, b[i:j] / b[i:j:k] -> bytes; item and
    equal-length slice assignment; a size change raises ValueError), weak
    references, release() and the context-manager protocol; heap Blocks can
    be resize()d. Any use after release raises ValueError; release or resize
    while a view is alive raises BufferError. A Block that is
    garbage-collected is released.
    """

    @property
    def size(self) -> int:
        """Bytes exposed through the buffer protocol."""
    @property
    def address(self) -> int:
        """The address of the first byte."""
    @property
    def usable_size(self) -> int:
        """Bytes actually reserved for the block (>= size)."""
    @property
    def released(self) -> bool:
        """True once released (or its Arena was reset)."""
    @property
    def kind(self) -> str:
        """'heap', 'pool' or 'arena'."""
    def release(self) -> None:
        """Give the memory back; idempotent; BufferError while a view is alive."""
    def resize(self, size: int, /) -> None:
        """Heap Blocks only (TypeError otherwise): change the size, keeping the
        first min(old, new) bytes; BufferError while a view is alive,
        MemoryError (Block unchanged) when out of memory."""
    def __len__(self) -> int: ...
    @overload
    def __getitem__(self, key: int, /) -> int: ...
    @overload
    def __getitem__(self, key: slice, /) -> bytes: ...
    @overload
    def __setitem__(self, key: int, value: int, /) -> None: ...
    @overload
    def __setitem__(self, key: slice, value: Union[bytes, bytearray, memoryview, Iterable[int]], /) -> None: ...
    def __iter__(self) -> Iterator[int]: ...
    def __buffer__(self, flags: int) -> memoryview: ...
    def __enter__(self) -> "Block": ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> bool: ...

class BufferPool:
    """BufferPool(buffer_size, *, capacity=None, prealloc=0, zero=False, align=64)

    A pool of fixed-size buffers (Blocks) reused instead of freed.
    """

    def __init__(
        self,
        buffer_size: int,
        *,
        capacity: Optional[int] = None,
        prealloc: int = 0,
        zero: bool = False,
        align: int = 64,
    ) -> None: ...
    def acquire(self, timeout: Optional[float] = 0.0) -> Block:
        """A Block from the pool. At capacity: timeout 0 (the default)
        raises PoolExhausted at once; None waits for a release; > 0 waits
        that long, then raises PoolExhausted (GIL released while waiting)."""
    async def acquire_async(self, timeout: Optional[float] = None) -> Block:
        """acquire() for asyncio: waits without blocking the event loop; the
        default timeout None waits as long as it takes; PoolExhausted after
        a positive timeout, at once with 0."""
    def release(self, block: Block) -> None:
        """Give a Block of this pool back; another pool's Block -> ValueError."""
    def stats(self) -> Dict[str, Any]:
        """acquires, releases, hits, misses, high_water, waits, ..."""
    def trim(self) -> int:
        """Give idle buffers' memory back; bytes released."""
    def close(self) -> None:
        """Free the pool; BufferError while buffers are in use; idempotent."""
    @property
    def buffer_size(self) -> int: ...
    @property
    def capacity(self) -> Optional[int]: ...
    @property
    def in_use(self) -> int: ...
    @property
    def idle(self) -> int: ...
    @property
    def align(self) -> int: ...
    @property
    def zero(self) -> bool: ...
    @property
    def closed(self) -> bool: ...
    def __enter__(self) -> "BufferPool": ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> bool: ...

class Arena:
    """Arena(chunk_size=1 << 20): bump allocation over chunks, freed at once by reset()."""

    def __init__(self, chunk_size: int = ...) -> None: ...
    def alloc(self, size: int, align: int = 16) -> Block:
        """A Block of size bytes, valid until the next reset()."""
    def reset(self) -> None:
        """Free every block at once; BufferError while any is exported."""
    @property
    def used(self) -> int: ...
    @property
    def reserved(self) -> int: ...
    @property
    def chunk_size(self) -> int: ...
    @property
    def generation(self) -> int: ...
    def __enter__(self) -> "Arena": ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> bool: ...

def malloc(size: int, *, zero: bool = False) -> Block:
    """Allocate size bytes from kpool's heap as a Block."""

def stats() -> Dict[str, Any]:
    """Process-wide allocator statistics; 'classes' is a list of per-class dicts."""

def stats_reset() -> None:
    """Zero the event counters (not the gauges)."""

def trim() -> int:
    """Give idle memory back to the OS; bytes released."""

def thread_flush() -> None:
    """Give this thread's cached free blocks back to the shared lists."""

class _Cancel(Protocol):
    def is_set(self) -> bool: ...

def stress(
    workload: str = "mixed",
    *,
    threads: int = 4,
    ops: int = 1000000,
    allocator: str = "kpool",
    seed: int = 1,
    verify: bool = True,
    size: int = 0,
    burst_bytes: int = 0,
    duration: Optional[float] = None,
    cancel: Optional[_Cancel] = None,
) -> Dict[str, Any]:
    """Run the C stress driver (GIL released); CorruptionError on damage.

    workload: pairs mixed random larson prodcons burst frag; threads: 1..1024;
    ops: operations over all threads; allocator: kpool kpool-pool system null;
    seed: RNG seed; verify: stamp and check every block; size: pairs' block
    size (0 = 32); burst_bytes: burst's total (0 = 1 GiB); duration: stop
    after that many seconds (None: no limit); cancel: an Event-like object
    whose is_set() stops the run. A run stopped early returns its result with
    stopped=True and stop_reason 'duration' or 'cancel'; Ctrl-C in the main
    thread raises KeyboardInterrupt.

    Defaults differ from the kpool-stress executable's (1 thread, verify
    off): this function checks by default."""

def stress_cancel() -> int:
    """Stop every stress() run in progress (any thread); how many there were."""

def live_blocks() -> Tuple[int, int, int]:
    """How many Blocks hold memory now: (heap, pool, arena)."""
