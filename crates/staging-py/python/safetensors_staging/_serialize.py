"""A safetensors file's bytes, in and out: what the `save*` and `load(data)` functions share.

Saving is the Rust `safetensors` crate's (byte for byte what `safetensors` writes); a file is
written to a temporary file in the same directory and renamed into place.
"""

from __future__ import annotations

import operator
import os
from typing import Any, List, Tuple

from . import _native


def check_names(tensors: Any, metadata: Any) -> None:
    """The argument checks `safetensors` makes before saving, with its exceptions."""
    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, tensor] but received {type(tensors)}")
    for name in tensors:
        if not isinstance(name, str):
            raise TypeError(
                f"argument 'tensor_dict': '{type(name).__name__}' object is not an instance of "
                "'str'"
            )
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise TypeError(
                f"argument 'metadata': '{type(metadata).__name__}' object is not a dict"
            )
        for key, value in metadata.items():
            for item in (key, value):
                if not isinstance(item, str):
                    raise TypeError(
                        f"argument 'metadata': '{type(item).__name__}' object is not an "
                        "instance of 'str'"
                    )


def serialize(
    flat: List[Tuple[str, str, List[int], Any]], metadata: Any, filename: Any = None
) -> Any:
    """Saves `(name, dtype code, shape, uint8 host array)`s through the Rust `safetensors` crate.

    Returns:
        The file's bytes when `filename` is None; else None, the file written atomically.
    """
    target = None if filename is None else os.fsdecode(os.fspath(filename))
    return _native._serialize(flat, None if metadata is None else dict(metadata), target)


def parse(data: Any) -> Tuple[int, List[Tuple[str, str, List[int], int, int]], Any]:
    """A safetensors file's bytes, parsed by the library.

    Returns:
        `(start of the data, [(name, dtype, shape, begin, end)], metadata)`; `begin` and `end`
        count from the start of the data.

    Raises:
        TypeError: `data` is not bytes.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"argument 'data': expected bytes, got {type(data).__name__}")
    return _native._parse(bytes(data))


def as_unsigned(value: Any) -> int:
    """An unsigned 64-bit int, refused as `safetensors`' Rust side (PyO3) refuses it: a
    `TypeError` for what is not an int, an `OverflowError` below 0 or past 64 bits."""
    number = operator.index(value)
    if number < 0:
        raise OverflowError("can't convert negative int to unsigned")
    if number >= 1 << 64:
        raise OverflowError("int too big to convert")
    return number
