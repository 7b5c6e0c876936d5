"""`safe_open` with the behaviour of `safetensors.safe_open`, on this library's loads.

A handle opens the backend once and reads the headers once (`_native._reader`); each
`get_tensor` is one small load of one tensor on that backend, its files kept open for the life of
the handle, and each `get_slice(name)[...]` reads only the rows of dimension 0 the index needs
(for an index on an inner dimension, every row: the smallest run of rows covering it). The index
is checked first against an empty stand-in of the tensor (a `meta` tensor, a zero-stride NumPy
array), so a bad index raises exactly what the framework raises, before any byte is read.
"""

from __future__ import annotations

import json
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Tuple

from . import _native
from ._native import _DTYPES, InvalidOptionError, SelectionError, StagingError, UnsupportedDtypeError

# `except SafetensorError` written for `safetensors` catches every error of this package.
SafetensorError = StagingError

_FRAMEWORKS = {"pt": "pt", "torch": "pt", "np": "np", "numpy": "np", "flax": "flax", "jax": "flax"}


def _framework(framework: Any) -> str:
    name = _FRAMEWORKS.get(str(framework).lower()) if isinstance(framework, str) else None
    if name is None:
        raise InvalidOptionError(f"framework {framework} is invalid")
    return name


# `get_tensor` in file order reads the next tensor while the caller uses this one when the next
# is smaller than this: a bigger tensor is read in chunks by every I/O thread already, a smaller
# one by one thread, so reading two at once is what keeps the threads busy. It costs the memory
# of one tensor under this size, and the bytes of one tensor if the caller then stops.
_READ_AHEAD_BELOW = 16 << 20


class _Torch:
    """Tensors as `torch.Tensor`, on the handle's device (`gpu`: its GPU ordinal, if any)."""

    name = "pt"

    def __init__(self, gpu: Optional[int]) -> None:
        self.gpu = gpu

    def convert(self, staged: Any, dtype: str, shape: List[int], name: str) -> Any:
        from . import _to_torch, _torch_device

        tensor = _to_torch(staged, "raise")
        if self.gpu is not None and tensor.device.type == "cpu":
            # Device memory ran short and the policy assembled it in host memory: a drop-in
            # for `safetensors` hands out what was asked for, so it is moved (and raises
            # torch's out-of-memory error if it cannot be).
            tensor = tensor.to(_torch_device(self.gpu))
        return tensor

    def own(self, tensor: Any) -> Any:
        """A compact copy of a view."""
        import torch

        return tensor.clone(memory_format=torch.contiguous_format)

    def stand_in(self, dtype: str, shape: List[int], name: str) -> Any:
        import torch

        from . import _torch_view

        target, viewed = _torch_view(dtype, shape, "raise", name)
        return torch.empty(viewed, dtype=target, device="meta")


class _Numpy:
    """Arrays as `numpy.ndarray`, in host memory."""

    name = "np"

    def own(self, array: Any) -> Any:
        """A compact copy of a view."""
        return array.copy()

    def convert(self, staged: Any, dtype: str, shape: List[int], name: str) -> Any:
        from . import _to_numpy

        return _to_numpy(staged, "raise")

    def stand_in(self, dtype: str, shape: List[int], name: str) -> Any:
        import numpy

        from . import _to_numpy

        if _DTYPES[dtype].numpy is None:
            _to_numpy(_Described(dtype, name), "raise")  # raises UnsupportedDtypeError
        return numpy.broadcast_to(numpy.zeros((), dtype=numpy.uint8), shape)


class _Jax:
    """Arrays as `jax.Array` (through NumPy, with `ml_dtypes` for bfloat16 and float8)."""

    name = "flax"

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

        return jnp.asarray(self.host_array(staged, dtype, shape, name))

    def stand_in(self, dtype: str, shape: List[int], name: str) -> Any:
        import numpy

        self.dtype_of(dtype, name)
        return numpy.broadcast_to(numpy.zeros((), dtype=numpy.uint8), shape)


class _Described:
    """What `_to_numpy` reads of a tensor to name it in an error."""

    def __init__(self, dtype: str, name: str) -> None:
        self.dtype = dtype
        self.name = name


def _covering_rows(key: Any, dim0: int, ndim: int) -> Tuple[Optional[Tuple[int, int]], Any]:
    """The rows `(start, end)` of dimension 0 that `tensor[key]` needs, and the key to apply
    to just those rows; `(None, key)` when every row is needed (or the key is of a kind this
    does not narrow: lists, arrays, booleans). `key` has been checked valid already."""
    entries = key if isinstance(key, tuple) else (key,)
    simple = all(
        e is None or e is Ellipsis or isinstance(e, slice) or (isinstance(e, int) and not isinstance(e, bool))
        for e in entries
    )
    if ndim == 0 or not simple:
        return None, key
    consuming = sum(1 for e in entries if e is not None and e is not Ellipsis)
    position = None
    for i, entry in enumerate(entries):
        if entry is None:
            continue
        if entry is Ellipsis:
            if consuming < ndim:
                return None, key  # the ellipsis covers dimension 0
            continue  # it covers no dimension
        position = i
        break
    if position is None:
        return None, key
    entry = entries[position]
    if isinstance(entry, int):
        row = entry + dim0 if entry < 0 else entry
        rows, local = (row, row + 1), 0
    else:
        start, stop, step = entry.indices(dim0)
        count = len(range(start, stop, step))
        last = start + (count - 1) * step
        if count == 0:
            rows, local = (0, 0), slice(0, 0)
        elif step > 0:
            rows, local = (start, last + 1), slice(0, last + 1 - start, step)
        else:  # NumPy and JAX step backwards: from `start` down to `last`, row 0 of those read
            rows, local = (last, start + 1), slice(start - last, None, step)
    if rows == (0, dim0) and local == slice(0, dim0, 1):
        return None, key
    narrowed = entries[:position] + (local,) + entries[position + 1 :]
    return rows, narrowed if isinstance(key, tuple) else narrowed[0]


def _nbytes(array: Any) -> int:
    return int(array.nbytes)


class safe_slice:
    """A tensor not yet read: `get_shape()`, `get_dtype()`, and `[...]` (ints, slices,
    negative indices, `...`, `None`, on any dimension) reading only the rows it needs."""

    def __init__(self, handle: "safe_open", name: str, dtype: str, shape: List[int]) -> None:
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


class safe_open:
    """`safetensors.safe_open`, on this library's loads: a context manager (or a plain
    object), with `keys()`, `offset_keys()`, `metadata()`, `get_tensor(name)`,
    `get_slice(name)` and `get_tensors()`.

    filename: a `.safetensors` file as for `safetensors`, or anything `load_file` takes: a
        directory, an index, a hub-cache snapshot, a URL.
    framework: "pt"/"torch", "np"/"numpy", "flax"/"jax".
    device: "cpu" (default), "cuda", "cuda:N", an int, a `torch.device` (torch only): reads go
        through the GPU backends as `load_file`'s do.
    Every other keyword is one of `load_file`'s options (backend, memory_cap, chunk_size,
    remote options, ...); `backend="mmap"` or `"pread"` (`safetensors`' own) mean the default.

    `report()` counts every read so far (`bytes_read`, `read_requests`, `tensors`, paths);
    `bytes_read` is there as an attribute too.
    """

    def __init__(self, filename: Any, framework: Any = "pt", device: Any = "cpu", **options: Any) -> None:
        from . import _device, _paths

        self._framework_name = _framework(framework)
        if options.get("backend") in ("mmap", "pread"):
            options.pop("backend")
        if self._framework_name == "pt":
            spelled, gpu = _device(device)
            self._convert: Any = _Torch(gpu)
        else:
            spelled = "cpu"
            self._convert = _Numpy() if self._framework_name == "np" else _Jax()
        self._reader = _native._reader(_paths(filename), device=spelled, **options)
        checkpoint = self._reader.checkpoint()
        self._infos = {info.name: info for info in checkpoint.tensors()}
        self._offset_keys = [info.name for info in checkpoint.tensors()]
        self._position = {name: i for i, name in enumerate(self._offset_keys)}
        self._metadata = checkpoint.metadata()
        self._closed = False
        # Reading ahead (see `_READ_AHEAD_BELOW`): the tensor being read ahead, the position
        # of the last tensor asked for, and the threads that read ahead (made when needed).
        self._ahead_lock = threading.Lock()
        self._ahead: Optional[Tuple[str, "Future[Any]"]] = None
        self._last = -1
        self._ahead_thread: Optional[ThreadPoolExecutor] = None

    def __enter__(self) -> "safe_open":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Lets go of the backend and its files; tensors already read stay valid."""
        self._closed = True
        with self._ahead_lock:
            self._ahead = None
            thread, self._ahead_thread = self._ahead_thread, None
        # Closed first: a read ahead waiting on a server that stopped answering ends now (the
        # reader's close interrupts its reads), not at the request timeout.
        self._reader.close()
        if thread is not None:
            thread.shutdown(wait=True)  # a read ahead ends, and its tensor is dropped

    def _check_open(self) -> None:
        if self._closed:
            raise SafetensorError("File is closed")

    def _info(self, name: str) -> Any:
        self._check_open()
        if not isinstance(name, str):
            raise TypeError(f"argument 'name': '{type(name).__name__}' object is not an instance of 'str'")
        info = self._infos.get(name)
        if info is None:
            raise SelectionError(f"File does not contain tensor {name}")
        return info

    def keys(self) -> List[str]:
        """The tensor names, sorted (as `safetensors` gives them)."""
        self._check_open()
        return sorted(self._infos)

    def offset_keys(self) -> List[str]:
        """The tensor names in the order of their bytes (file by file for a sharded
        checkpoint)."""
        self._check_open()
        return list(self._offset_keys)

    def metadata(self) -> Optional[Dict[str, str]]:
        """The header's `__metadata__` (the first file's, for a sharded checkpoint), or None."""
        self._check_open()
        return None if self._metadata is None else dict(self._metadata)

    def get_tensor(self, name: str) -> Any:
        """The whole tensor `name`, read now (or already read ahead: asked for in file order,
        the next small tensor is read while the caller uses this one)."""
        info = self._info(name)
        pending = self._read_ahead_after(name)
        staged = None
        if pending is not None:
            try:
                staged = pending.result()
            except Exception:
                # The read ahead ran on its own (a Ctrl-C then may have ended it): this call
                # reads the tensor itself, and a real error comes again from there.
                staged = None
        if staged is None:
            staged = self._reader.read(name)
        return self._convert.convert(staged, info.dtype, list(info.shape), name)

    def _read_ahead_after(self, name: str) -> "Optional[Future[Any]]":
        """The read of `name` already under way, if any; and the next tensor read ahead when
        `name` follows the last one asked for in file order."""
        position = self._position[name]
        with self._ahead_lock:
            pending = None
            if self._ahead is not None and self._ahead[0] == name:
                pending = self._ahead[1]
            self._ahead = None  # a read ahead not asked for next is dropped
            sequential = position == self._last + 1
            self._last = position
            following = position + 1
            if sequential and following < len(self._offset_keys) and not self._closed:
                upcoming = self._offset_keys[following]
                if self._infos[upcoming].nbytes < _READ_AHEAD_BELOW:
                    if self._ahead_thread is None:
                        self._ahead_thread = ThreadPoolExecutor(
                            # Two: the tensor asked for may still be being read ahead by one
                            # when the next is asked of the other.
                            2, thread_name_prefix="safe_open-read-ahead")
                    self._ahead = (upcoming, self._ahead_thread.submit(self._reader.read, upcoming))
        return pending

    def get_slice(self, name: str) -> safe_slice:
        """The tensor `name`, not read yet: index it to read the rows the index needs."""
        info = self._info(name)
        return safe_slice(self, name, info.dtype, list(info.shape))

    def get_tensors(self) -> Dict[str, Any]:
        """Every tensor, read in file order, by name."""
        return {name: self.get_tensor(name) for name in self.offset_keys()}

    def _slice(self, name: str, dtype: str, shape: List[int], key: Any) -> Any:
        self._check_open()
        stand_in = self._convert.stand_in(dtype, shape, name)
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
            rows, local = _covering_rows(key, int(stand_in.shape[0]), int(stand_in.ndim))
        staged = self._reader.read(name, rows)
        read_shape = list(shape) if rows is None else [rows[1] - rows[0], *shape[1:]]
        tensor = self._convert.convert(staged, dtype, read_shape, name)
        result = tensor[local]
        if _nbytes(result) < _nbytes(tensor):
            # A view of part of what was read (columns of every row, one element): its own
            # compact copy, so that the rest is freed now rather than held by the view (a
            # tensor-parallel rank keeping its share of the columns holds its share only).
            result = self._convert.own(result)
        return result

    def report(self) -> Dict[str, Any]:
        """Every read so far, with the keys of `stage --json`: `bytes_read`,
        `read_requests`, `tensors`, `bytes`, `paths`, `backend`, `mode`, ..."""
        return json.loads(self._reader.report_json())

    @property
    def bytes_read(self) -> int:
        """Bytes read from storage by this handle so far."""
        return int(self.report()["bytes_read"])

    @property
    def backend(self) -> str:
        """The backend reads go through: `host`, `cufile` or `hipfile`."""
        return self._reader.backend

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._infos)} tensors"
        return f"safe_open({self._framework_name}, {self.backend}, {state})"


# A framework dtype's name (`str(torch.float32)`'s tail, `numpy.dtype.name`, ml_dtypes') as the
# format writes it, from the one table.
_CODES = {
    framework: code
    for code, facts in _DTYPES.items()
    for framework in (facts.torch, facts.numpy, facts.ml_dtypes)
    if framework is not None
}


def _code(name: str, dtype_name: str) -> str:
    code = _CODES.get(dtype_name)
    if code is None:
        raise InvalidOptionError(
            f"tensor {name!r}: dtype {dtype_name} cannot be saved; supported: {', '.join(_CODES)}"
        )
    return code


def _check_names(tensors: Any, metadata: Any) -> None:
    """The argument checks `safetensors` makes before saving, with its exceptions."""
    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, tensor] but received {type(tensors)}")
    for name in tensors:
        if not isinstance(name, str):
            raise TypeError(f"argument 'tensor_dict': '{type(name).__name__}' object is not an instance of 'str'")
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise TypeError(f"argument 'metadata': '{type(metadata).__name__}' object is not a dict")
        for key, value in metadata.items():
            for item in (key, value):
                if not isinstance(item, str):
                    raise TypeError(f"argument 'metadata': '{type(item).__name__}' object is not an instance of 'str'")


def _serialize(flat: List[Tuple[str, str, List[int], Any]], metadata: Any, filename: Any = None) -> Any:
    """Saves `(name, dtype code, shape, uint8 host array)`s through the Rust `safetensors`
    crate: to `filename` atomically, or as `bytes`."""
    target = None if filename is None else os.fsdecode(os.fspath(filename))
    return _native._serialize(flat, None if metadata is None else dict(metadata), target)


def _parsed(data: Any) -> Tuple[int, List[Tuple[str, str, List[int], int, int]], Any]:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"argument 'data': expected bytes, got {type(data).__name__}")
    return _native._parse(bytes(data))
