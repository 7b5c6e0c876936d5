"""The functions of `safetensors.flax`, on this library: `load_file` and `load` into
`{name: jax.Array}`, `save_file` and `save` from them. Arrays pass through NumPy (with
`ml_dtypes` for bfloat16 and float8, as JAX itself uses); host memory (JAX's default device
places them).
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from . import numpy as _numpy
from ._compat import _Jax, safe_open

__all__ = ["load", "load_file", "save", "save_file"]


def load_file(filename: Any, **options: Any) -> Dict[str, Any]:
    """Loads a checkpoint into `{name: jax.Array}`. Takes `safetensors_staging.load_file`'s
    keywords except `device`."""
    with safe_open(filename, framework="flax", **options) as handle:
        return handle.get_tensors()


def load(data: bytes) -> Dict[str, Any]:
    """The arrays of a safetensors file's bytes, as `jax.Array`s."""
    import jax.numpy as jnp

    from ._compat import _parsed

    start, tensors, _ = _parsed(data)
    view = memoryview(data)
    out = {}
    convert = _Jax()
    for name, dtype, shape, begin, end in tensors:
        out[name] = jnp.asarray(convert.array_of(bytes(view[start + begin : start + end]), dtype, shape, name))
    return out


def _to_numpy(arrays: Dict[str, Any]) -> Dict[str, Any]:
    import numpy

    return {name: numpy.asarray(array) for name, array in arrays.items()}


def save(tensors: Dict[str, Any], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """The bytes of a safetensors file of the arrays (and `metadata`, text only)."""
    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, jax.Array] but received {type(tensors)}")
    return _numpy.save(_to_numpy(tensors), metadata)


def save_file(tensors: Dict[str, Any], filename: Any, metadata: Optional[Dict[str, str]] = None) -> None:
    """Saves the arrays (and `metadata`) to `filename`, atomically."""
    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, jax.Array] but received {type(tensors)}")
    _numpy.save_file(_to_numpy(tensors), filename, metadata)
