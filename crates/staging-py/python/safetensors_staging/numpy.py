"""The functions of `safetensors.numpy` (`load_file`, `load`, `save_file`, `save`), and `stage`.

Host memory only. NumPy has no bfloat16, float8, float6 or float4: loading such tensors raises
`UnsupportedDtypeError` (a `TypeError`, as NumPy's "data type not understood") unless
`unsupported_dtypes="uint8"`, which gives each as `uint8` of its bytes, the last dimension
widened to bytes, so that `arr.view(ml_dtypes.bfloat16)` gives the values back. Saving takes
`ml_dtypes` arrays (bfloat16, float8) as they are.

Arrays are memory of their own, independent of the file, as `safetensors.numpy` gives them:
the file can be truncated, rewritten or replaced while they live. `map=True` makes them
private, copy-on-write mappings of the file instead (no copy; the page cache is their memory),
with a mapping's risks: a file truncated under them kills the process with `SIGBUS` when the
lost pages are touched, a file rewritten in place may show through, and each file with a live
array holds one of the process's `vm.max_map_count` mappings. `map="auto"` (torch's default,
mapping) means `False` here.

Saving is written by the Rust `safetensors` crate, byte for byte what `safetensors` writes, and
`save_file` is atomic (a temporary file renamed into place). A non-contiguous or big-endian
array is saved as its values (made contiguous and little-endian on the way), not as its raw
memory.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from . import _convert, _dtypes, _load, _serialize
from ._load import Paths, Stage
from ._native import _DTYPES, UnsupportedDtypeError

__all__ = ["load", "load_file", "save", "save_file", "stage"]


def stage(path: Paths, *, unsupported_dtypes: str = "raise", **options: Any) -> Stage:
    """Loads a checkpoint into host memory, yielding `(name, numpy.ndarray)` in file order.

    Args:
        path: what `safetensors_staging.stage` takes.
        unsupported_dtypes: "raise" (an `UnsupportedDtypeError` for a dtype NumPy lacks) or
            "uint8" (such tensors as `uint8` of their bytes).
        **options: the keywords of `safetensors_staging.stage` except `device`.

    Returns:
        A `Stage` yielding arrays.

    Raises:
        TypeError: a `device=` keyword.
        InvalidOptionError: a bad option value.
    """
    if "device" in options:
        raise TypeError("safetensors_staging.numpy loads into host memory: no device= here")
    _dtypes.check_unsupported_dtypes(unsupported_dtypes)
    if options.get("backend") in ("mmap", "pread"):
        options.pop("backend")
    _load.copy_unless_mapping_asked(options)
    # Host memory whatever the machine has: NumPy cannot read device memory (`auto` would pick a
    # GPU where there is one).
    return _load.stage_with(
        path, "cpu", lambda staged: _convert.to_numpy(staged, unsupported_dtypes), **options
    )


def load_file(path: Paths, **options: Any) -> Dict[str, Any]:
    """Loads a checkpoint into `{name: numpy.ndarray}`.

    Args:
        path: what `safetensors_staging.stage` takes.
        **options: the keywords of `stage`.

    Returns:
        Every array by name.

    Raises:
        UnsupportedDtypeError: a dtype NumPy lacks, unless `unsupported_dtypes="uint8"`.
    """
    with stage(path, **options) as arrays:
        return dict(arrays)


def load(data: bytes) -> Dict[str, Any]:
    """The arrays of a safetensors file's bytes.

    Args:
        data: the bytes of a safetensors file.

    Returns:
        Read-only views of `data` by name, as `safetensors.numpy.load` gives.

    Raises:
        UnsupportedDtypeError: a dtype NumPy lacks.
    """
    import numpy

    start, tensors, _ = _serialize.parse(data)
    out = {}
    for name, dtype, shape, begin, end in tensors:
        native = _DTYPES[dtype].numpy
        if native is None:
            raise UnsupportedDtypeError(f"tensor {name!r}: NumPy has no dtype for {dtype}")
        kind = numpy.dtype(native)
        count = (end - begin) // kind.itemsize
        out[name] = numpy.frombuffer(data, dtype=kind, count=count, offset=start + begin).reshape(
            shape
        )
    return out


def _flatten(arrays: Dict[str, Any]) -> List[Tuple[str, str, List[int], Any]]:
    import numpy

    flat = []
    for name, array in arrays.items():
        if not isinstance(array, numpy.ndarray):
            raise ValueError(
                f"Key `{name}` is invalid, expected numpy.ndarray but received {type(array)}"
            )
        code = _dtypes.code_of(name, array.dtype.name)
        little = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
        values = numpy.ascontiguousarray(array, dtype=little)
        flat.append((name, code, list(array.shape), values.reshape(-1).view(numpy.uint8)))
    return flat


def save(tensor_dict: Dict[str, Any], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """The bytes of a safetensors file of the arrays.

    Args:
        tensor_dict: `numpy.ndarray`s by name.
        metadata: text to text, written as the header's `__metadata__`.

    Returns:
        The file's bytes.

    Raises:
        ValueError: not a dict of arrays.
        InvalidOptionError: a dtype the format lacks.
    """
    _serialize.check_names(tensor_dict, metadata)
    return _serialize.serialize(_flatten(tensor_dict), metadata)


def save_file(
    tensor_dict: Dict[str, Any], filename: Any, metadata: Optional[Dict[str, str]] = None
) -> None:
    """Saves the arrays to `filename`, atomically.

    Args:
        tensor_dict: `numpy.ndarray`s by name.
        filename: the file to write (replaced by a rename once written).
        metadata: text to text, written as the header's `__metadata__`.

    Raises:
        ValueError: not a dict of arrays.
        InvalidOptionError: a dtype the format lacks.
    """
    _serialize.check_names(tensor_dict, metadata)
    _serialize.serialize(_flatten(tensor_dict), metadata, filename)
