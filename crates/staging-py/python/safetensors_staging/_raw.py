"""`safetensors`' raw API: `TensorSpec`, `serialize`, `serialize_file`, `deserialize`.

Tensors described by a dtype, a shape and the address and length of their bytes, as
`safetensors` 0.8 takes them; saved through the same Rust `safetensors` crate as `save_file`.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Tuple

from . import _native, _serialize

# The constructor-style names `TensorSpec` takes (NumPy's and torch's), to the file's codes.
_SPEC_DTYPES = {
    "bool": "BOOL",
    "int8": "I8",
    "uint8": "U8",
    "int16": "I16",
    "uint16": "U16",
    "int32": "I32",
    "uint32": "U32",
    "int64": "I64",
    "uint64": "U64",
    "float16": "F16",
    "float32": "F32",
    "float64": "F64",
    "bfloat16": "BF16",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e4m3fnuz": "F8_E4M3FNUZ",
    "float8_e5m2": "F8_E5M2",
    "float8_e5m2fnuz": "F8_E5M2FNUZ",
    "float8_e8m0fnu": "F8_E8M0",
    "float4_e2m1fn_x2": "F4",
    "complex64": "C64",
}


class TensorSpec:
    """One tensor for `serialize` / `serialize_file`: a dtype, a shape and the address and
    length of its contiguous bytes in host memory.

    `TensorSpec(dtype="float32", shape=[2, 3], data_ptr=array.ctypes.data, data_len=24)`.
    `dtype` is NumPy's or torch's name (`"bfloat16"`, `"float8_e4m3fn"`), checked here;
    `.dtype` is the file's code (`"F32"`). For `float4_e2m1fn_x2` (two values a byte) the last
    dimension of `shape` is the storage's and is doubled. The memory at `data_ptr` must stay
    alive and unchanged until the `serialize` that reads it returns: it is read, not kept.
    """

    __slots__ = ("_dtype", "_shape", "_data_ptr", "_data_len")

    def __init__(self, *, dtype: str, shape: Any, data_ptr: int, data_len: int) -> None:
        # Every argument taken as `safetensors` takes it (PyO3: a str; a sequence of unsigned
        # ints, not a str; unsigned 64-bit ints), in order, before the dtype is looked up.
        if not isinstance(dtype, str):
            raise TypeError(
                f"argument 'dtype': '{type(dtype).__name__}' object is not an instance of 'str'"
            )
        if isinstance(shape, (str, bytes)):
            raise TypeError("argument 'shape': Can't extract `str` to `Vec`")
        dims = [_serialize.as_unsigned(d) for d in shape]
        data_ptr, data_len = _serialize.as_unsigned(data_ptr), _serialize.as_unsigned(data_len)
        code = _SPEC_DTYPES.get(dtype)
        if code is None:
            raise _native.InvalidOptionError(
                f"Unknown dtype {json.dumps(dtype)}. Supported dtypes: {', '.join(_SPEC_DTYPES)}"
            )
        if code == "F4" and dims:
            if dims[-1] * 2 >= 1 << 64:
                raise _native.InvalidOptionError(
                    f"F4 last-dim {dims[-1]} doubled to logical shape overflows usize"
                )
            dims[-1] *= 2
        object.__setattr__(self, "_dtype", code)
        object.__setattr__(self, "_shape", dims)
        object.__setattr__(self, "_data_ptr", data_ptr)
        object.__setattr__(self, "_data_len", data_len)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"TensorSpec is frozen: {name} cannot be set")

    @property
    def dtype(self) -> str:
        """The file's dtype code (`"F32"`, `"BF16"`)."""
        return self._dtype

    @property
    def shape(self) -> List[int]:
        """The shape written into the header (values, not bytes)."""
        return list(self._shape)

    @property
    def data_ptr(self) -> int:
        """The address of the tensor's contiguous bytes."""
        return self._data_ptr

    @property
    def data_len(self) -> int:
        """The length of the tensor's bytes."""
        return self._data_len

    def __repr__(self) -> str:
        return (
            f"TensorSpec(dtype='{self._dtype}', shape={self._shape}, "
            f"data_ptr={self._data_ptr}, data_len={self._data_len})"
        )


def _flat_of_specs(tensor_dict: Any) -> List[Tuple[str, str, List[int], Any]]:
    import ctypes

    import numpy

    if not isinstance(tensor_dict, dict):
        raise TypeError(
            f"argument 'tensor_dict': '{type(tensor_dict).__name__}' object is not a dict"
        )
    flat = []
    for name, spec in tensor_dict.items():
        if not isinstance(name, str):
            raise TypeError(
                f"argument 'tensor_dict': '{type(name).__name__}' object is not an instance of "
                "'str'"
            )
        if not isinstance(spec, TensorSpec):
            raise TypeError(
                f"argument 'tensor_dict': '{type(spec).__name__}' object is not an instance of "
                "'TensorSpec'"
            )
        if spec.data_len == 0:
            raw = numpy.empty(0, dtype=numpy.uint8)
        elif spec.data_ptr == 0:
            raise _native.InvalidOptionError(
                f"Error while serializing: tensor {name!r} has a null data_ptr and "
                f"{spec.data_len} bytes"
            )
        else:
            # A view of the caller's memory, read in place by the serializer (no copy).
            raw = numpy.ctypeslib.as_array(
                (ctypes.c_ubyte * spec.data_len).from_address(spec.data_ptr)
            )
        flat.append((name, spec.dtype, spec.shape, raw))
    return flat


def serialize(
    tensor_dict: Dict[str, TensorSpec], metadata: Optional[Dict[str, str]] = None
) -> bytes:
    """The bytes of a safetensors file of the tensors `tensor_dict` describes.

    Written by the Rust `safetensors` crate, byte for byte what `safetensors.serialize` returns.

    Args:
        tensor_dict: `{name: TensorSpec}`; the memory each names must stay alive meanwhile.
        metadata: text to text, the header's `__metadata__`.

    Raises:
        TypeError: not a dict of `TensorSpec`s (a raw dict, as before `safetensors` 0.8).
        StagingError: a spec's length does not match its dtype and shape, or a null address.
    """
    if metadata is not None:
        _serialize.check_names({}, metadata)
    return _serialize.serialize(_flat_of_specs(tensor_dict), metadata)  # type: ignore[no-any-return]


def serialize_file(
    tensor_dict: Dict[str, TensorSpec], filename: Any, metadata: Optional[Dict[str, str]] = None
) -> None:
    """Writes the safetensors file of the tensors `tensor_dict` describes to `filename`,
    atomically (a temporary file in the same directory, renamed into place); the GIL is
    released while it is written.

    Raises:
        TypeError: not a dict of `TensorSpec`s.
        StagingError: as `serialize`, or the file cannot be written.
    """
    if metadata is not None:
        _serialize.check_names({}, metadata)
    _serialize.serialize(_flat_of_specs(tensor_dict), metadata, filename)


def deserialize(bytes: Any) -> List[Tuple[str, Dict[str, Any]]]:  # `bytes`: their keyword
    """`safetensors.deserialize`: every tensor of a file's bytes, in the file's order, as
    `(name, {"shape": [...], "dtype": "F32", "data": bytearray})`.

    Raises:
        MalformedCheckpointError: (`SafetensorError`) not a valid file, `Error while
            deserializing: ...` as `safetensors` words it.
    """
    data = bytes
    try:
        start, tensors, _ = _serialize.parse(data)
    except _native.MalformedCheckpointError as error:
        prefix = "Error while deserializing header: "
        text = str(error)
        if text.startswith(prefix):
            text = "Error while deserializing: " + text[len(prefix) :]
        raise _native.MalformedCheckpointError(text) from None
    view = memoryview(data)
    return [
        (
            name,
            {
                "shape": list(shape),
                "dtype": dtype,
                "data": bytearray(view[start + begin : start + end]),
            },
        )
        for name, dtype, shape, begin, end in tensors
    ]
