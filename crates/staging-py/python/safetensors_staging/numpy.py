"""NumPy front door: `load_file` into `{name: numpy.ndarray}` (like
`safetensors.numpy.load_file`) and `stage`, an iterator of `(name, ndarray)`; host memory only.

NumPy has no bfloat16, float8, float6 or float4: such tensors raise `UnsupportedDtypeError`
unless `unsupported_dtypes="uint8"`, which gives each as `uint8` of its bytes, the last
dimension widened to bytes, so that `arr.view(ml_dtypes.bfloat16)` gives the values back.
"""

from __future__ import annotations

from typing import Any, Dict

from . import Paths, Stage, _stage, _to_numpy

__all__ = ["load_file", "stage"]


def stage(path: Paths, *, unsupported_dtypes: str = "raise", **options: Any) -> Stage:
    """Loads a checkpoint into host memory, yielding `(name, numpy.ndarray)` in file order.
    Takes the keywords of `safetensors_staging.stage` except `device`."""
    if "device" in options:
        raise TypeError("safetensors_staging.numpy loads into host memory: no device= here")
    if unsupported_dtypes not in ("raise", "uint8"):
        raise ValueError(f"unsupported_dtypes={unsupported_dtypes!r}: expected \"raise\" or \"uint8\"")
    return _stage(path, None, lambda staged: _to_numpy(staged, unsupported_dtypes), **options)


def load_file(path: Paths, **options: Any) -> Dict[str, Any]:
    """Loads a checkpoint into `{name: numpy.ndarray}`. Takes the keywords of `stage`."""
    with stage(path, **options) as arrays:
        return dict(arrays)
