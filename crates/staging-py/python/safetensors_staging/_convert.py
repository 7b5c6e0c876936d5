"""Loaded tensors (`_native._Staged`) as the frameworks' tensors, zero-copy through DLPack."""

from __future__ import annotations

import contextlib
import sys
from typing import TYPE_CHECKING, Any, Iterable, Iterator, List, MutableMapping, Optional

from . import _native
from ._device import torch_device
from ._dtypes import torch_view
from ._native import _DTYPES, UnsupportedDtypeError
from ._requires import need

if TYPE_CHECKING:
    import torch


def to_torch(staged: Any, unsupported_dtypes: str) -> torch.Tensor:
    """A loaded tensor as torch's: its bytes through DLPack, viewed as torch's dtype.

    Zero-copy, and whatever DLPack types the installed torch imports.
    """
    import torch

    raw = torch.from_dlpack(staged.as_bytes())
    return torch_from_bytes(raw, staged.dtype, list(staged.shape), unsupported_dtypes, staged.name)


_TORCH_FAST: Optional[Any] = None


def torch_fast() -> Any:
    """The converter of loaded tensors into torch's from Rust (`_native._Fast`: torch's DLPack
    importer called per tensor, with no Python between two), for the dtypes whose import gives
    exactly what `to_torch` gives: the same dtype, shape and strides, checked once per process
    on a probe tensor of each dtype. Tensors of other dtypes are left to `to_torch`.
    """
    global _TORCH_FAST
    if _TORCH_FAST is None:
        import torch

        importer = getattr(torch._C, "_from_dlpack", None) or torch.utils.dlpack.from_dlpack
        example = torch.empty(0)
        trial = _native._Fast(example, importer, list(_DTYPES))
        kept = []
        for dtype in _DTYPES:
            staged = _native._probe_staged(dtype)
            try:
                expected = to_torch(staged, "raise")
                got = trial.convert(staged)
            except Exception:  # torch has no such dtype, or its importer refuses it
                continue
            if (
                isinstance(got, torch.Tensor)
                and got.dtype == expected.dtype
                and got.shape == expected.shape
                and got.stride() == expected.stride()
                and got.device == expected.device
            ):
                kept.append(dtype)
        _TORCH_FAST = _native._Fast(example, importer, kept)
    return _TORCH_FAST


def on_the_device(device: Any, options: MutableMapping[str, Any]) -> Optional[int]:
    """For `load_file`: where `device` names a GPU, no tensor is assembled in host memory unless
    the caller asks (`host_assembly=True`): each tensor is on that GPU, or the call raises an
    out-of-memory error, as `safetensors` raises torch's. The GPU's ordinal (None for "cpu"
    and "auto"). (`safe_open` keeps the policy and moves a host-assembled tensor to the GPU,
    which a slice of a tensor too large for the GPU needs.)"""
    from ._device import resolve_device

    _, gpu = resolve_device(device)
    if gpu is not None:
        options.setdefault("host_assembly", False)
    return gpu


def _torch_out_of_memory_class() -> Optional[type]:
    """`TorchOutOfMemoryError`: the library's `OutOfMemoryError` and `torch.OutOfMemoryError`
    at once; None where torch is not imported or has no such class."""
    made = globals().get("_TORCH_OOM")
    if made is not None:
        return made
    torch = sys.modules.get("torch")
    theirs = getattr(torch, "OutOfMemoryError", None)
    if theirs is None:
        return None
    made = type(
        "TorchOutOfMemoryError",
        (_native.OutOfMemoryError, theirs),
        {
            "__module__": __name__,
            "__qualname__": "TorchOutOfMemoryError",
            "__doc__": "Device memory ran short on a GPU: the library's `OutOfMemoryError` "
            "(kind `device-allocation`) and `torch.OutOfMemoryError`, as `safetensors` raises.",
        },
    )
    globals()["_TORCH_OOM"] = globals()["TorchOutOfMemoryError"] = made
    return made


def __getattr__(name: str) -> Any:
    # `TorchOutOfMemoryError` is made once torch is imported: a pickled one (sent back by a
    # worker process) is found here by name.
    if name == "TorchOutOfMemoryError":
        import torch  # noqa: F401  (the class subclasses torch's)

        return _torch_out_of_memory_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@contextlib.contextmanager
def torch_out_of_memory(gpu: Optional[int]) -> Iterator[None]:
    """Device memory running short on a GPU (the library's `OutOfMemoryError`, or torch's from
    moving a tensor there) raised as `TorchOutOfMemoryError`: both the library's and
    `torch.OutOfMemoryError` (what `safetensors` raises there), where torch has that class;
    code that catches either catches it."""
    torch = sys.modules.get("torch")
    theirs = getattr(torch, "OutOfMemoryError", None)
    caught: Any = (_native.OutOfMemoryError,) + ((theirs,) if theirs is not None else ())
    try:
        yield
    except caught as error:
        both = _torch_out_of_memory_class() if gpu is not None else None
        if both is None or isinstance(error, both):
            raise
        raised = both(*error.args)
        raised.__dict__.update(getattr(error, "__dict__", {}))
        raise raised from error


def written_in_place(tensors: Iterable[Any]) -> None:
    """Tells autograd that the library wrote these tensors' memory, as torch's own in-place
    ops do (`copy_` under `no_grad`): each one's version counter is bumped, so a `backward()`
    that saved the old values raises instead of silently using the new ones. Anything not a
    torch tensor (a NumPy array, another DLPack array) has no version and is passed over, as
    are tensors made under `torch.inference_mode()` (which have none: torch before 2.5 raises
    when asked to bump one).
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return  # no torch tensor can exist in a process that never imported torch
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor) and not tensor.is_inference():
            torch.autograd.graph.increment_version(tensor)


def torch_from_bytes(
    buffer: torch.Tensor, dtype: str, shape: List[int], unsupported_dtypes: str, name: str
) -> torch.Tensor:
    """A `uint8` tensor of a tensor's bytes, viewed as its dtype and shape (zero-copy)."""
    target, shape = torch_view(dtype, shape, unsupported_dtypes, name)
    tensor = buffer.reshape(shape) if target is None else buffer.view(target).reshape(shape)
    if tensor.numel() == 0:
        # A reshape of no elements gives strides of 0 after a dimension of 0 (`(0, 2, 1)` for
        # `[2, 0, 2, 1]`); torch's own empty tensors, and `safetensors`', count it as 1.
        return tensor.new_empty(tensor.shape)
    return tensor


def registered_numpy_dtype(dtype: str) -> Any:
    """NumPy's dtype for a dtype it lacks, where another package registered one under the name
    `safetensors` asks NumPy for: `bfloat16`, which `ml_dtypes` registers once imported (JAX
    imports it). `safetensors.numpy` then gives BF16 tensors as such arrays, and raises
    NumPy's `TypeError` otherwise; so does this. None where NumPy knows no such name now."""
    import numpy

    if dtype != "BF16":
        return None  # `safetensors` asks NumPy for no other name that a package registers
    try:
        return numpy.dtype("bfloat16")
    except TypeError:
        return None


def to_numpy(staged: Any, unsupported_dtypes: str) -> Any:
    """A loaded tensor as a NumPy array (zero-copy), or its bytes as `uint8` when asked for.

    Raises:
        UnsupportedDtypeError: NumPy has no dtype for it and `unsupported_dtypes` is "raise".
    """
    import numpy

    array = None
    if _DTYPES[staged.dtype].numpy is not None:
        array = numpy.from_dlpack(staged)
    elif unsupported_dtypes == "uint8":
        array = numpy.from_dlpack(staged.as_bytes())
    else:
        registered = registered_numpy_dtype(staged.dtype)
        if registered is not None:
            array = numpy.from_dlpack(staged.as_bytes()).view(registered).reshape(staged.shape)
    if array is not None:
        if array.size == 0:
            # No elements: every stride 0, as `safetensors`' arrays have them.
            return numpy.lib.stride_tricks.as_strided(array, strides=(0,) * array.ndim)
        return array
    raise UnsupportedDtypeError(
        f"tensor {staged.name!r}: NumPy has no dtype for {staged.dtype}; pass "
        'unsupported_dtypes="uint8" for its bytes (then .view(ml_dtypes.bfloat16), for example)'
    )


# The converters of `safe_open`, one per framework: `convert` (a loaded tensor as the
# framework's), `own` (a compact copy of a view) and `stand_in` (an empty tensor of that dtype
# and shape, to check an index against before any byte is read).


class ToTorch:
    """Tensors as `torch.Tensor`, on the handle's device (`gpu`: its GPU ordinal, if any)."""

    name = "pt"
    # A slice of a tensor mapped from its file is a view of the mapping, as `safetensors`'.
    views_of_mappings = True

    def __init__(self, gpu: Optional[int]) -> None:
        need("torch", 'framework="pt"')
        self.gpu = gpu
        # Reads convert to torch's tensors as they hand them out, where they can.
        self.fast = torch_fast()

    def convert(self, staged: Any, dtype: str, shape: List[int], name: str) -> Any:
        """`staged` as torch's tensor (`staged` is one already where the read converted it
        through `fast`)."""
        tensor = to_torch(staged, "raise") if isinstance(staged, _native._Staged) else staged
        if self.gpu is not None and tensor.device.type == "cpu":
            # Device memory ran short and the policy assembled it in host memory: a drop-in
            # for `safetensors` hands out what was asked for, so it is moved (and raises
            # torch's out-of-memory error if it cannot be).
            tensor = tensor.to(torch_device(self.gpu))
        return tensor

    def converted(self, tensor: Any) -> Any:
        """A tensor `fast` made: on the handle's GPU, as `convert` gives it."""
        if self.gpu is not None and tensor.device.type == "cpu":
            tensor = tensor.to(torch_device(self.gpu))  # see `convert`
        return tensor

    def own(self, tensor: Any) -> Any:
        """A compact copy of a view."""
        import torch

        return tensor.clone(memory_format=torch.contiguous_format)

    def stand_in(self, dtype: str, shape: List[int], name: str) -> Any:
        import torch

        target, viewed = torch_view(dtype, shape, "raise", name)
        return torch.empty(viewed, dtype=target, device="meta")


class ToNumpy:
    """Arrays as `numpy.ndarray`, in host memory: copies of their own, as `safetensors.numpy`
    gives, unless `views` (`map=True` asked for), when a tensor mapped from its file is a view
    of the mapping."""

    name = "np"
    fast = None  # NumPy's arrays are made in Python

    def __init__(self, views: bool = False) -> None:
        self.views_of_mappings = views

    def own(self, array: Any) -> Any:
        """A compact copy of a view."""
        return array.copy()

    def convert(self, staged: Any, dtype: str, shape: List[int], name: str) -> Any:
        array = to_numpy(staged, "raise")
        if staged.path == "mapped" and not self.views_of_mappings:
            # Independent of the file (a truncation, a rewrite in place), as `safetensors`'
            # arrays are; the mapping only spared a read into a buffer of the library's own.
            return array.copy()
        return array

    def stand_in(self, dtype: str, shape: List[int], name: str) -> Any:
        import numpy

        if _DTYPES[dtype].numpy is None and registered_numpy_dtype(dtype) is None:
            to_numpy(_Described(dtype, name), "raise")  # raises UnsupportedDtypeError
        return numpy.broadcast_to(numpy.zeros((), dtype=numpy.uint8), shape)


class ToJax:
    """Arrays as `jax.Array` (through NumPy, with `ml_dtypes` for bfloat16 and float8)."""

    name = "flax"
    views_of_mappings = False
    fast = None  # JAX's arrays are made in Python

    def __init__(self) -> None:
        need("jax.numpy", 'framework="flax"')

    def own(self, array: Any) -> Any:
        """JAX arrays own their memory already."""
        return array

    def dtype_of(self, dtype: str, name: str) -> Any:
        import numpy

        facts = _DTYPES[dtype]
        if facts.numpy is not None:
            return numpy.dtype(facts.numpy)
        if facts.ml_dtypes is not None:
            import ml_dtypes

            return numpy.dtype(getattr(ml_dtypes, facts.ml_dtypes))
        raise UnsupportedDtypeError(f"tensor {name!r}: JAX has no dtype for {dtype}")

    def array_of(self, raw: Any, dtype: str, shape: List[int], name: str) -> Any:
        """A NumPy array of a tensor's bytes (anything with the buffer protocol)."""
        import numpy

        return numpy.frombuffer(raw, dtype=self.dtype_of(dtype, name)).reshape(shape)

    def host_array(self, staged: Any, dtype: str, shape: List[int], name: str) -> Any:
        import numpy

        kind = self.dtype_of(dtype, name)
        return numpy.from_dlpack(staged.as_bytes()).view(kind).reshape(shape)

    def convert(self, staged: Any, dtype: str, shape: List[int], name: str) -> Any:
        import jax.numpy as jnp

        array = self.host_array(staged, dtype, shape, name)
        if staged.path == "mapped":
            # JAX may alias a NumPy array's memory (where its alignment suits it), which would
            # make the array a view of the file: a mapping (`map=True`) is copied into JAX's
            # own memory, so Flax's arrays are independent of the file whatever `map` says.
            # The copy is done before this returns (JAX copies on a thread of its own, later,
            # and a file truncated meanwhile would fault there).
            return jnp.array(array, copy=True).block_until_ready()
        return jnp.asarray(array)

    def stand_in(self, dtype: str, shape: List[int], name: str) -> Any:
        import numpy

        self.dtype_of(dtype, name)
        return numpy.broadcast_to(numpy.zeros((), dtype=numpy.uint8), shape)


class _Described:
    """What `to_numpy` reads of a tensor to name it in an error."""

    def __init__(self, dtype: str, name: str) -> None:
        self.dtype = dtype
        self.name = name
