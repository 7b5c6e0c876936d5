"""The functions of `safetensors.flax` (`load_file`, `load`, `save_file`, `save`), on this library.

Arrays pass through NumPy (with `ml_dtypes` for bfloat16 and float8, as JAX itself uses), in host
memory (JAX's default device places them). They are independent of the file, as
`safetensors.flax`'s are, whatever `map` says: `map=True` reads through a mapping of the file and
copies each array into JAX's memory.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from . import _convert, _serialize
from . import numpy as _numpy
from ._safe_open import safe_open

__all__ = ["load", "load_file", "save", "save_file"]


def load_file(filename: Any, **options: Any) -> Dict[str, Any]:
    """Loads a checkpoint into `{name: jax.Array}`.

    Args:
        filename: what `safetensors_staging.load_file` takes.
        **options: `safetensors_staging.load_file`'s keywords except `device`.

    Returns:
        Every array by name.
    """
    with safe_open(filename, framework="flax", **options) as handle:
        return handle.get_tensors()


def load(data: bytes) -> Dict[str, Any]:
    """The arrays of a safetensors file's bytes.

    Args:
        data: the bytes of a safetensors file.

    Returns:
        Every array by name, as `jax.Array`s.
    """
    convert = _convert.ToJax()  # an ImportError naming the fix where JAX is not installed
    import jax.numpy as jnp

    start, tensors, _ = _serialize.parse(data)
    view = memoryview(data)
    out = {}
    for name, dtype, shape, begin, end in tensors:
        out[name] = jnp.asarray(
            convert.array_of(bytes(view[start + begin : start + end]), dtype, shape, name)
        )
    return out


def _to_numpy(arrays: Dict[str, Any]) -> Dict[str, Any]:
    import numpy

    return {name: numpy.asarray(array) for name, array in arrays.items()}


def save(tensors: Dict[str, Any], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """The bytes of a safetensors file of the arrays.

    Args:
        tensors: `jax.Array`s by name.
        metadata: text to text, written as the header's `__metadata__`.

    Returns:
        The file's bytes.

    Raises:
        ValueError: not a dict of arrays.
    """
    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, jax.Array] but received {type(tensors)}")
    return _numpy.save(_to_numpy(tensors), metadata)


def save_file(
    tensors: Dict[str, Any], filename: Any, metadata: Optional[Dict[str, str]] = None
) -> None:
    """Saves the arrays to `filename`, atomically.

    Args:
        tensors: `jax.Array`s by name.
        filename: the file to write (replaced by a rename once written).
        metadata: text to text, written as the header's `__metadata__`.

    Raises:
        ValueError: not a dict of arrays.
    """
    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, jax.Array] but received {type(tensors)}")
    _numpy.save_file(_to_numpy(tensors), filename, metadata)
