"""The functions of `safetensors.torch`, on this library.

Change `from safetensors.torch import load_file, save_file` to
`from safetensors_staging.torch import load_file, save_file`.

Loading goes through the library's loads (a GPU `device` through cuFile or hipFile), and the
file may also be a directory, an index, a hub-cache snapshot or a URL. Saving is written by the
Rust `safetensors` crate, byte for byte what `safetensors` writes; `save_file` writes a
temporary file in the same directory and renames it into place, so a reader of the old file is
never broken and a failed save leaves it as it was. Saving checks what `safetensors` checks,
with its exceptions.
"""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple, Union

from . import _convert, _dtypes, _load, _requires, _serialize
from ._load_into import LoadIntoResult, load_into
from ._native import _DTYPES

try:
    import torch
except ModuleNotFoundError as error:  # the message names the extra that installs torch
    _requires.missing(error, "torch", "safetensors_staging.torch")
    raise

__all__ = [
    "LoadIntoResult",
    "load",
    "load_file",
    "load_into",
    "load_model",
    "save",
    "save_file",
    "save_model",
    "storage_ptr",
    "storage_size",
]

PathLike = Union[str, "os.PathLike[str]"]


def load_file(filename: Any, device: Any = "cpu", **options: Any) -> Dict[str, torch.Tensor]:
    """Loads a checkpoint into `{name: torch.Tensor}` on `device`.

    Args:
        filename: a `.safetensors` file, or anything `safetensors_staging.load_file` takes (a
            directory, an index, a hub-cache snapshot, a URL).
        device: "cpu" (default), "cuda", "cuda:N", an int or a `torch.device`.
        **options: every keyword of `safetensors_staging.load_file`; `backend="mmap"` or
            `"pread"` (`safetensors`' own) mean the default.

    Returns:
        Every tensor by name.

    Raises:
        StagingError: the checkpoint cannot be read (its subclass says why).
    """
    if options.get("backend") in ("mmap", "pread"):
        options.pop("backend")
    return _load.load_file(filename, device, **options)


def load(data: bytes) -> Dict[str, torch.Tensor]:
    """The tensors of a safetensors file's bytes.

    Args:
        data: the bytes of a safetensors file.

    Returns:
        Every tensor by name, each owning a copy of its bytes.
    """
    start, tensors, _ = _serialize.parse(data)
    view = memoryview(data)
    out = {}
    for name, dtype, shape, begin, end in tensors:
        raw = bytearray(view[start + begin : start + end])
        buffer = (
            torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        )
        out[name] = _convert.torch_from_bytes(buffer, dtype, shape, "raise", name)
    return out


# The helpers of `safetensors.torch` that other libraries import (transformers imports
# `storage_ptr` and `storage_size`; accelerate and peft the shared-tensor ones), with its
# behaviour: the same groups in the same order, the same names kept.


def storage_ptr(tensor: torch.Tensor) -> int:
    """The address of the storage under `tensor` (0 for a tensor without one, as on `meta`)."""
    try:
        return tensor.untyped_storage().data_ptr()
    except (NotImplementedError, RuntimeError):
        return 0


def storage_size(tensor: torch.Tensor) -> int:
    """The bytes of the storage under `tensor` (its own bytes for a tensor without one)."""
    try:
        return tensor.untyped_storage().nbytes()
    except (NotImplementedError, RuntimeError):
        return tensor.nelement() * tensor.element_size()


def _end_ptr(tensor: torch.Tensor) -> int:
    """The address past `tensor`'s last element (its address when it has none)."""
    if tensor.nelement():
        return tensor.view(-1)[-1].data_ptr() + tensor.element_size()
    return tensor.data_ptr()


def _is_complete(tensor: torch.Tensor) -> bool:
    """Whether `tensor` covers its whole storage, from its first byte."""
    return tensor.data_ptr() == storage_ptr(tensor) and tensor.nelement() * (
        tensor.element_size()
    ) == storage_size(tensor)


def _filter_shared_not_shared(
    groups: List[Set[str]], state_dict: Dict[str, torch.Tensor]
) -> List[Set[str]]:
    """Each group of names on one storage split where the bytes they cover do not overlap
    (two halves of one buffer are not shared)."""
    out: List[Set[str]] = []
    for names in groups:
        if len(names) < 2:
            out.append(names)
            continue
        spans = sorted((state_dict[n].data_ptr(), _end_ptr(state_dict[n]), n) for n in names)
        _, last_stop, first = spans[0]
        out.append({first})
        for begin, stop, name in spans[1:]:
            if begin >= last_stop:
                out.append({name})
            else:
                out[-1].add(name)
            last_stop = stop
    return out


def _find_shared_tensors(state_dict: Dict[str, torch.Tensor]) -> List[Set[str]]:
    """Names whose tensors share memory, in groups (a name alone is a group of one); tensors
    without storage (`meta`, empty) are left out."""
    by_storage: Dict[Tuple[Any, int, int], Set[str]] = defaultdict(set)
    for name, tensor in state_dict.items():
        if tensor.device.type == "meta":
            continue
        address, size = storage_ptr(tensor), storage_size(tensor)
        if address and size:
            # The device is part of the key: two GPUs may use the same addresses.
            by_storage[(tensor.device, address, size)].add(name)
    # `sorted` of sets, as safetensors does, so that the groups come in its order.
    return _filter_shared_not_shared(sorted(by_storage.values()), state_dict)  # type: ignore[type-var]


def _remove_duplicate_names(
    state_dict: Dict[str, torch.Tensor],
    *,
    preferred_names: Optional[Iterable[str]] = None,
    discard_names: Optional[Iterable[str]] = None,
) -> Dict[str, List[str]]:
    """For each group of names sharing memory, the one kept (covering its whole storage; the
    first in sorted order, preferring `preferred_names`, then those not in `discard_names`)
    and the others, to drop: `{kept: [dropped, ...]}`.

    Raises:
        RuntimeError: no name of a group covers the memory the group shares.
    """
    prefer = set(preferred_names or ())
    avoid = set(discard_names or ())
    dropped: Dict[str, List[str]] = defaultdict(list)
    for group in _find_shared_tensors(state_dict):
        whole = {n for n in group if _is_complete(state_dict[n])}
        if not whole:
            # safetensors' words.
            raise RuntimeError(
                "Error while trying to find names to remove to save state dict, but found no "
                f"suitable name to keep for saving amongst: {group}. None is covering the entire "
                "storage.Refusing to save/load the model since you could be storing much more "
                "memory than needed. Please refer to "
                "https://huggingface.co/docs/safetensors/torch_shared_tensors for more "
                "information. Or open an issue."
            )
        keep = min(whole)
        if whole - avoid:
            keep = min(whole - avoid)
        if prefer & whole:
            keep = min(prefer & whole)
        for name in sorted(group):
            if name != keep:
                dropped[keep].append(name)
    return dropped


def _flatten(tensors: Dict[str, torch.Tensor]) -> List[Tuple[str, str, List[int], Any]]:
    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, torch.Tensor] but received {type(tensors)}")
    sparse = []
    for name, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(
                f"Key `{name}` is invalid, expected torch.Tensor but received {type(tensor)}"
            )
        if tensor.layout != torch.strided:
            sparse.append(name)
    if sparse:
        # safetensors' words, which its tests compare.
        raise ValueError(
            f"You are trying to save a sparse tensors: `{sparse}` which this library does not "
            "support. You can make it a dense tensor before saving with `.to_dense()` but be "
            "aware this might make a much larger file than needed."
        )
    shared = [sorted(g) for g in _find_shared_tensors(tensors) if len(g) > 1]
    if shared:
        raise RuntimeError(
            f"Some tensors share memory, which would be saved twice and load as separate tensors: "
            f"{shared}. Save the model with `save_model`, which keeps one of each."
        )
    flat = []
    for name, tensor in tensors.items():
        if not tensor.is_contiguous():
            raise ValueError(
                f"You are trying to save a non contiguous tensor: `{name}`, which is not allowed. "
                "Call `.contiguous()` on it first (or save the full tensor and slice it at load time)."
            )
        host = tensor.detach().to("cpu")
        code = _dtypes.code_of(name, str(host.dtype).rsplit(".", 1)[-1])
        shape = list(host.shape)
        if shape:
            # The file counts values, and one torch element may hold several (F4's holds two).
            shape[-1] = shape[-1] * host.element_size() * 8 // _DTYPES[code].bits
        raw = (
            host.reshape(-1).view(torch.uint8)
            if host.numel()
            else torch.empty(0, dtype=torch.uint8)
        )
        flat.append((name, code, shape, raw))
    return flat


def save(tensors: Dict[str, torch.Tensor], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """The bytes of a safetensors file of `tensors`.

    Args:
        tensors: dense, contiguous tensors by name, no two sharing memory.
        metadata: text to text, written as the header's `__metadata__`.

    Returns:
        The file's bytes.

    Raises:
        ValueError: not a dict of tensors, or a sparse or non-contiguous tensor.
        RuntimeError: tensors share memory (use `save_model`).
    """
    flat = _flatten(tensors)  # first, as safetensors: a non-dict is named as torch's
    _serialize.check_names(tensors, metadata)
    return _serialize.serialize(flat, metadata)


def save_file(
    tensors: Dict[str, torch.Tensor], filename: PathLike, metadata: Optional[Dict[str, str]] = None
) -> None:
    """Saves `tensors` to `filename`, atomically.

    Args:
        tensors: dense, contiguous tensors by name, no two sharing memory.
        filename: the file to write (replaced by a rename once written).
        metadata: text to text, written as the header's `__metadata__`.

    Raises:
        ValueError: not a dict of tensors, or a sparse or non-contiguous tensor.
        RuntimeError: tensors share memory (use `save_model`).
    """
    flat = _flatten(tensors)
    _serialize.check_names(tensors, metadata)
    _serialize.serialize(flat, metadata, filename)


def save_model(
    model: torch.nn.Module,
    filename: PathLike,
    metadata: Optional[Dict[str, str]] = None,
    force_contiguous: bool = True,
) -> None:
    """Saves `model`'s state dict, each group of tensors sharing memory (tied weights) once.

    Args:
        model: the model.
        filename: the file to write, atomically.
        metadata: text to text; the names dropped are added as `{dropped: kept}`, never over
            the caller's own keys.
        force_contiguous: save non-contiguous tensors as contiguous copies.

    Raises:
        ValueError: a non-contiguous tensor with `force_contiguous=False`.
        RuntimeError: tensors share memory and none of them covers it whole.
    """
    state = model.state_dict()
    for kept, names in _remove_duplicate_names(state).items():
        for name in names:
            if metadata is None:
                metadata = {}
            metadata.setdefault(name, kept)
            del state[name]
    if force_contiguous:
        state = {k: v.contiguous() for k, v in state.items()}
    try:
        save_file(state, filename, metadata)
    except ValueError as e:
        raise ValueError(f"{e} Or use save_model(..., force_contiguous=True).") from None


def load_model(
    model: torch.nn.Module, filename: Any, strict: bool = True, device: Any = "cpu", **options: Any
) -> Tuple[Set[str], List[str]]:
    """Loads a file saved by `save_model` (or any with the model's names) into `model`.

    Names the model shares memory between count as loaded when one of them is.

    Args:
        model: the model.
        filename: what `load_file` takes.
        strict: raise when a name is missing or unexpected.
        device: where the tensors are read to before `load_state_dict` copies them.
        **options: `load_file`'s keywords.

    Returns:
        `(missing, unexpected)` names: a set and a list, as `safetensors` returns them.

    Raises:
        RuntimeError: with `strict`, a name missing or unexpected.
    """
    state = load_file(filename, device, **options)
    dropped = _remove_duplicate_names(model.state_dict(), preferred_names=state.keys())
    missing_list, unexpected = model.load_state_dict(state, strict=False)
    missing = set(missing_list)
    for names in dropped.values():
        for name in names:
            if name in missing:
                missing.remove(name)
            else:
                unexpected.append(name)
    if strict and (missing or unexpected):
        lines = [f"Error(s) in loading state_dict for {type(model).__name__}:"]
        if missing:
            lines.append(
                "    Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in sorted(missing))
            )
        if unexpected:
            lines.append(
                "    Unexpected key(s) in state_dict: "
                + ", ".join(f'"{k}"' for k in sorted(unexpected))
            )
        raise RuntimeError("\n".join(lines))
    return missing, unexpected
