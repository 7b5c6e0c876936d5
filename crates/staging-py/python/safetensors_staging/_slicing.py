"""Slices read lazily: `safe_slice`, and the rows of dimension 0 an index needs.

`get_slice(name)[...]` reads only the rows of dimension 0 the index needs, and of those, where
the handle maps its files (host tensors from local files), only the columns of dimension 1 the
index needs: torch gets a view of the mapping (as `safetensors` gives), NumPy and JAX a copy of
the smallest run of each row covering them. Elsewhere (a GPU, `map=False`) an index on an inner
dimension reads every row it covers whole, and the result is a compact copy. The index is checked first
against an empty stand-in of the tensor (a `meta` tensor, a zero-stride NumPy array), so a bad
index raises exactly what the framework raises, before any byte is read; for NumPy and Flax,
whose tensors `safetensors` slices by rules of its own (stricter than NumPy's), first what
those refuse, in its words.
"""

from __future__ import annotations

import operator
from typing import Any, List, Optional, Protocol, Tuple

from ._native import _DTYPES, StagingError
from ._serialize import as_unsigned


class SliceReader(Protocol):
    """What reads a slice's rows: a `safe_open` handle (named here by what it does, so that
    this module needs nothing of the one that uses it)."""

    def _slice(self, name: str, dtype: str, shape: List[int], key: Any) -> Any: ...


def covering_rows(key: Any, dim0: int, ndim: int) -> Tuple[Optional[Tuple[int, int]], Any]:
    """The rows of dimension 0 that `tensor[key]` needs, and the key to apply to just those.

    Args:
        key: an index, already checked valid.
        dim0: the length of dimension 0.
        ndim: the number of dimensions.

    Returns:
        `((start, end), narrowed key)`; or `(None, key)` when every row is needed, or the key
        is of a kind this does not narrow (lists, arrays, booleans).
    """
    return covering_range(key, 0, dim0, ndim)


def covering_range(
    key: Any, dim: int, size: int, ndim: int
) -> Tuple[Optional[Tuple[int, int]], Any]:
    """The smallest range of dimension `dim` that `tensor[key]` needs, and the key to apply to
    a tensor holding just that range of the dimension.

    Args:
        key: an index, already checked valid.
        dim: the dimension.
        size: its length.
        ndim: the number of dimensions.

    Returns:
        `((start, end), narrowed key)`; or `(None, key)` when all of the dimension is needed,
        or the key is of a kind this does not narrow (lists, arrays, booleans).
    """
    entries = key if isinstance(key, tuple) else (key,)
    simple = all(
        e is None
        or e is Ellipsis
        or isinstance(e, slice)
        or (isinstance(e, int) and not isinstance(e, bool))
        for e in entries
    )
    if ndim <= dim or not simple:
        return None, key
    consuming = sum(1 for e in entries if e is not None and e is not Ellipsis)
    position = None
    at = 0  # the dimension the next entry that consumes one indexes
    for i, entry in enumerate(entries):
        if entry is None:
            continue
        if entry is Ellipsis:
            covered = max(ndim - consuming, 0)
            if at <= dim < at + covered:
                return None, key  # the ellipsis covers the dimension
            at += covered
            continue
        if at == dim:
            position = i
            break
        at += 1
    if position is None:
        return None, key
    entry = entries[position]
    if isinstance(entry, int):
        index = entry + size if entry < 0 else entry
        span, local = (index, index + 1), 0
    else:
        start, stop, step = entry.indices(size)
        count = len(range(start, stop, step))
        last = start + (count - 1) * step
        if count == 0:
            span, local = (0, 0), slice(0, 0)
        elif step > 0:
            span, local = (start, last + 1), slice(0, last + 1 - start, step)
        else:  # NumPy and JAX step backwards: from `start` down to `last`, entry 0 of those read
            span, local = (last, start + 1), slice(start - last, None, step)
    if span == (0, size) and local == slice(0, size, 1):
        return None, key
    narrowed = entries[:position] + (local,) + entries[position + 1 :]
    return span, narrowed if isinstance(key, tuple) else narrowed[0]


def _indexer_text(start: Optional[int], stop: Optional[int], step: int, select: bool) -> str:
    """An indexer as `safetensors` shows it in an error (`2`, `:20`, `0:4:2`)."""
    if select:
        return str(start)
    text = f"{'' if start is None else start}:{'' if stop is None else stop}"
    return text if step == 1 else f"{text}:{step}"


def check_index_as_safetensors(key: Any, shape: List[int]) -> Any:
    """Refuses, with `safetensors`' words, what its slicing of NumPy and Flax tensors refuses.

    `safetensors` slices those frameworks' tensors itself (its Rust `parse_indexers` and
    `slice_byte_ranges`), more strictly than NumPy: ints, slices of non-negative bounds and a
    positive step, one `...`; an empty list; every bound within its dimension. (With torch it
    indexes a torch tensor, and torch's rules apply: `read_slice` checks those.)

    Returns:
        The key to index with, as `safetensors` reads it: ints as ints (a bool is 1 or 0, not
        a mask), an empty list as the empty slice it means (JAX takes no list), steps past a
        dimension's end clamped to it. Not mirrored: a slice whose start is past its stop,
        where `safetensors` 0.8 fails in ways of its own (an overflow, a panic, a bogus shape),
        gives the empty result NumPy gives; sub-byte dtypes (F4), which NumPy and JAX cannot
        hold, are refused by the conversion instead.

    Raises:
        StagingError: (`SafetensorError`) what `safetensors` raises, in its words.
        OverflowError: a negative slice bound, as `safetensors` raises it.
    """
    if isinstance(key, list):
        if key:
            raise StagingError("Non empty lists are not implemented")
        items: List[Any] = [slice(0, 0)]  # an empty selection
    else:
        items = list(key) if isinstance(key, tuple) else [key]
    ellipses = sum(1 for it in items if it is Ellipsis)
    if ellipses > 1:
        raise StagingError("Only one ellipsis (...) is allowed in slice index")
    expansion = max(len(shape) - (len(items) - ellipses), 0)
    # (start, stop: None when not given; step; a single index?) per dimension, in order.
    indexers: List[Tuple[Optional[int], Optional[int], int, bool]] = []
    # The key as `safetensors` reads it, for the framework to apply: ints as ints (a bool is
    # 1 or 0, not a mask), steps past the dimension's end clamped (JAX takes no step beyond
    # int32).
    normalized: List[Any] = []
    for it in items:
        dim = len(indexers)
        size = shape[dim] if dim < len(shape) else 0
        if it is Ellipsis:
            indexers.extend((None, None, 1, False) for _ in range(expansion))
            normalized.append(Ellipsis)
        elif isinstance(it, slice):
            # Extracted as `safetensors` extracts them (PyO3: the bounds as unsigned, the step
            # as a C long), in that order, with Python's errors.
            bounds = [None if b is None else as_unsigned(b) for b in (it.start, it.stop)]
            step = 1 if it.step is None else operator.index(it.step)
            if not -(1 << 63) <= step < 1 << 63:
                raise OverflowError("Python int too large to convert to C long")
            if step <= 0:
                raise StagingError(f"Slice step must be a positive integer, got {step}")
            indexers.append((bounds[0], bounds[1], step, False))
            normalized.append(slice(bounds[0], bounds[1], min(step, max(size, 1))))
        else:
            try:
                index = operator.index(it)
            except TypeError:
                index = None
            if index is None or not -(1 << 31) <= index < 1 << 31:  # PyO3's i32
                raise StagingError(
                    f"Unsupported slice index at position {dim}: expected slice, int, or ellipsis"
                )
            if index < 0:
                if index + size < 0:
                    raise StagingError(f"Invalid index {index} for dimension {dim} of size {size}")
                index += size
            indexers.append((index, index + 1, 1, True))
            normalized.append(index)
    if len(indexers) > len(shape):
        problem = "more slicing indexes than dimensions in tensor"
    else:
        problem = ""
        # From the innermost dimension out, as `safetensors` checks them.
        for dim in reversed(range(len(indexers))):
            first, stop, _, _ = indexers[dim]
            size = shape[dim]
            start = first or 0
            end = size if stop is None else stop
            if start >= size or end > size:
                asked = start if start >= size else max(end - 1, 0)
                problem = f"index {asked} out of bounds for tensor dimension #{dim} of size {size}"
                break
    if problem:
        shown = ", ".join(_indexer_text(*indexer) for indexer in indexers)
        raise StagingError(f"Error during slicing [{shown}] with shape {list(shape)}: {problem}")
    return tuple(normalized) if isinstance(key, tuple) else normalized[0]


def read_slice(
    reader: Any,
    convert: Any,
    name: str,
    dtype: str,
    shape: List[int],
    key: Any,
    as_safetensors: bool = False,
) -> Any:
    """`tensor[key]` of tensor `name`, reading only the rows of dimension 0 it needs.

    Args:
        reader: the handle's `_native._Reader`.
        convert: the handle's converter (`_convert.ToTorch`, `ToNumpy` or `ToJax`).
        name: the tensor's name.
        dtype: its dtype, as the file writes it.
        shape: its shape, as the file has it.
        key: the index.
        as_safetensors: refuse first what `safetensors`' own slicing refuses
            (`check_index_as_safetensors`: its NumPy and Flax tensors).

    Raises:
        StagingError: with `as_safetensors`, an index `safetensors` refuses, in its words.
        IndexError: (or `ValueError`, `TypeError`) what the framework raises for a bad index,
            before any byte is read.
    """
    if as_safetensors:
        key = check_index_as_safetensors(key, shape)
    stand_in = convert.stand_in(dtype, shape, name)
    rows, local = (None, key)
    try:
        stand_in[key]  # raises what the framework raises for a bad index, before any read
    except (IndexError, ValueError, TypeError):
        raise
    except Exception:
        # An index the stand-in cannot take (a boolean mask of a `meta` tensor): the
        # whole tensor is read and the framework indexes it.
        stand_in = None
    # Rows of a 1-dimensional tensor of sub-byte values may not be whole bytes.
    if stand_in is not None and stand_in.ndim and (len(shape) > 1 or _DTYPES[dtype].bits % 8 == 0):
        rows, local = covering_rows(key, int(stand_in.shape[0]), int(stand_in.ndim))
    read_shape = list(shape) if rows is None else [rows[1] - rows[0], *shape[1:]]
    staged, columns = None, None
    if stand_in is not None and len(shape) > 1 and _DTYPES[dtype].bits % 8 == 0:
        columns, narrowed = covering_range(local, 1, int(shape[1]), len(shape))
    if columns is not None and not convert.views_of_mappings:
        # Only the columns of dimension 1 it needs, copied out of the mapping of the file
        # where the handle maps (host tensors from local files): a run of each row.
        staged = reader.read_columns(name, rows, columns)
        if staged is not None:
            local = narrowed
            read_shape[1] = columns[1] - columns[0]
    if staged is None:
        # Torch takes a view of the rows where they are a mapping of the file, as
        # `safetensors` does, and only the columns' bytes are counted as read: the bytes the
        # view can touch. (The rows are made resident first where the page cache does not
        # hold them: with rows of a few KiB, every page holds some of the columns anyway.)
        staged = reader.read(name, rows, columns)
    tensor = convert.convert(staged, dtype, read_shape, name)
    result = tensor[local]
    if staged.path == "mapped" and convert.views_of_mappings:
        return result
    if int(result.nbytes) < int(tensor.nbytes):
        # A view of part of what was read (columns of every row, one element): its own
        # compact copy, so that the rest is freed now rather than held by the view (a
        # tensor-parallel rank keeping its share of the columns holds its share only).
        result = convert.own(result)
    return result


class safe_slice:
    """A tensor not read yet, as `safetensors`' `get_slice` gives it.

    Indexing it (ints, slices, negative indices, `...`, `None`, on any dimension) reads only
    the rows of dimension 0 the index needs and, on the CPU from local files, only the columns
    of dimension 1.

    Example:
        ```python
        with st.safe_open("model.safetensors", framework="pt") as f:
            part = f.get_slice("lm_head.weight")[0:512]  # reads 512 rows
            share = f.get_slice("lm_head.weight")[:, 0:256]  # reads 256 columns of each row
        ```
    """

    def __init__(self, handle: SliceReader, name: str, dtype: str, shape: List[int]) -> None:
        self._handle = handle
        self._name = name
        self._dtype = dtype
        self._shape = shape

    def get_shape(self) -> List[int]:
        """The tensor's shape, as the file has it."""
        return list(self._shape)

    def get_dtype(self) -> str:
        """The tensor's dtype, as the file writes it (`"BF16"`)."""
        return self._dtype

    def __getitem__(self, key: Any) -> Any:
        return self._handle._slice(self._name, self._dtype, self._shape, key)

    def __repr__(self) -> str:
        return f"safe_slice({self._name!r}, dtype={self._dtype}, shape={self._shape})"
