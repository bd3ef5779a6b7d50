"""Type stubs for kpool._numpy, numpy's data memory on kpool (NEP 49).

Use it through the package: kpool.numpy_handler(), kpool.use_for_numpy().
"""

from typing import Any, Optional

HANDLER_NAME: str

def handler() -> Any:
    """kpool's PyDataMem_Handler in a PyCapsule named "mem_handler" (always the same object)."""

def get_handler() -> Any:
    """numpy's current handler capsule in this context."""

def set_handler(handler: Optional[Any], /) -> Any:
    """Make handler (a "mem_handler" capsule, None: numpy's default) current in this context; returns the previous one."""
