"""The format's dtypes as the frameworks see them, from the one table (`_native._DTYPES`)."""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

from ._native import _DTYPES, InvalidOptionError, UnsupportedDtypeError

# A framework dtype's name (`str(torch.float32)`'s tail, `numpy.dtype.name`, ml_dtypes') as the
# format writes it.
CODES = {
    framework: code
    for code, facts in _DTYPES.items()
    for framework in (facts.torch, facts.numpy, facts.ml_dtypes)
    if framework is not None
}


def check_unsupported_dtypes(unsupported_dtypes: str) -> None:
    """Raises `InvalidOptionError` unless `unsupported_dtypes` is "raise" or "uint8"."""
    if unsupported_dtypes not in ("raise", "uint8"):
        raise InvalidOptionError(
            f'unsupported_dtypes={unsupported_dtypes!r}: expected "raise" or "uint8"'
        )


def torch_view(
    dtype: str, shape: List[int], unsupported_dtypes: str, name: str
) -> Tuple[Optional[Any], List[int]]:
    """The torch dtype and shape a tensor's bytes are viewed as.

    Returns:
        `(torch dtype, shape)`, or `(None, byte shape)` for its bytes as `uint8` when
        `unsupported_dtypes` is "uint8" and torch has no dtype for it.

    Raises:
        UnsupportedDtypeError: torch has no dtype for it and `unsupported_dtypes` is "raise".
    """
    import torch

    facts = _DTYPES[dtype]
    target = getattr(torch, facts.torch, None) if facts.torch else None
    if target is not None:
        # One torch element may hold several values (F4's holds two): the last dimension counts
        # torch's elements.
        element_bits = target.itemsize * 8
        if not shape and facts.bits == element_bits:
            return target, []
        if shape and shape[-1] * facts.bits % element_bits == 0:
            return target, [*shape[:-1], shape[-1] * facts.bits // element_bits]
    if unsupported_dtypes == "uint8":
        last = shape[-1] * facts.bits if shape else 0
        return None, [*shape[:-1], last // 8] if shape and last % 8 == 0 else [-1]
    raise UnsupportedDtypeError(
        f"tensor {name!r}: torch {torch.__version__} has no dtype for {dtype} "
        f'(shape {list(shape)}); pass unsupported_dtypes="uint8" for its bytes'
    )


def code_of(name: str, dtype_name: str) -> str:
    """The format's code (`"BF16"`) of a framework dtype's name, to save tensor `name`.

    Raises:
        InvalidOptionError: the format has no such dtype.
    """
    found = CODES.get(dtype_name)
    if found is None:
        raise InvalidOptionError(
            f"tensor {name!r}: dtype {dtype_name} cannot be saved; supported: {', '.join(CODES)}"
        )
    return found
