"""`safe_open` with the behaviour of `safetensors.safe_open`, on this library's loads.

A handle opens the backend once and reads the headers once (`_native._reader`); each
`get_tensor` is one small load of one tensor on that backend, its files kept open for the life of
the handle, and each `get_slice(name)[...]` reads only the rows the index needs (`_slicing`).
"""

from __future__ import annotations

import json
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Dict, Iterator, List, Optional, Tuple

from . import _native
from ._convert import ToJax, ToNumpy, ToTorch, torch_out_of_memory
from ._device import resolve_device
from ._load import paths_of
from ._native import InvalidOptionError, SelectionError, StagingError
from ._slicing import read_slice, safe_slice

# `except SafetensorError` written for `safetensors` catches every error of this package; where
# `safetensors` is installed, `StagingError` also derives from `safetensors.SafetensorError`, so
# an `except` with that name imported from `safetensors` catches them too (errors.rs).
SafetensorError = StagingError

_FRAMEWORKS = {
    "pt": "pt",
    "torch": "pt",
    "np": "np",
    "numpy": "np",
    "flax": "flax",
    "jax": "flax",
}


def _framework(framework: Any) -> str:
    name = _FRAMEWORKS.get(str(framework).lower()) if isinstance(framework, str) else None
    if name is None:
        raise InvalidOptionError(f"framework {framework} is invalid")
    return name


# `get_tensor` in file order reads the next tensor while the caller uses this one when the next
# is smaller than this: a bigger tensor is read in chunks by every I/O thread already, a smaller
# one by one thread, so reading two at once is what keeps the threads busy. It costs the memory
# of one tensor under this size, and the bytes of one tensor if the caller then stops.
#
# A handle whose tensors are mappings of their files (path "mapped": the CPU, local files) does
# not read ahead: a mapped tensor whose pages are cached costs about 10 us to hand out, and a
# read ahead's thread and future cost about 100 us more per call (235 tensors of 1 GiB, warm:
# 30 ms against 4 ms, 2026-12-04). Cold, a mapped tensor is made resident on the calling
# thread, as `load_file` does (1.3x `safetensors`, docs/measured.md).
_READ_AHEAD_BELOW = 16 << 20


class safe_open:
    """`safetensors.safe_open`, on this library's loads.

    A context manager (or a plain object). `report()` counts every read so far.

    Args:
        filename: a `.safetensors` file as for `safetensors`, or anything `load_file` takes:
            a directory, an index, a hub-cache snapshot, a URL.
        framework: "pt"/"torch", "np"/"numpy" or "flax"/"jax".
        device: "cpu" (default), "cuda", "cuda:N", an int or a `torch.device` (torch only):
            reads go through the GPU backends as `load_file`'s do.
        **options: `load_file`'s options (`backend`, `memory_cap`, `chunk_size`, the remote
            options, ...); `backend="mmap"` or `"pread"` (`safetensors`' own) mean the
            default.

    Raises:
        InvalidOptionError: an unknown framework or a bad option.
        StagingError: the checkpoint cannot be opened (its subclass says why).

    Example:
        ```python
        with st.safe_open("model.safetensors", framework="pt", device="cuda:0") as f:
            for name in f.keys():
                tensor = f.get_tensor(name)
        ```
    """

    def __init__(
        self, filename: Any, framework: Any = "pt", device: Any = "cpu", **options: Any
    ) -> None:
        self._framework_name = _framework(framework)
        if options.get("backend") in ("mmap", "pread"):
            options.pop("backend")
        self._gpu: Optional[int] = None
        if self._framework_name == "pt":
            spelled, gpu = resolve_device(device)
            self._gpu = gpu
            self._convert: Any = ToTorch(gpu)
        else:
            spelled = "cpu"
            # Arrays of their own, independent of the file, as `safetensors`' are: read through
            # the mapping of the file where the handle maps (a slice of columns reads only those
            # columns) and copied out, unless `map=True` asks for views of the mapping (NumPy).
            self._convert = ToNumpy() if self._framework_name == "np" else ToJax()
        try:
            self._reader = _native._reader(paths_of(filename), device=spelled, **options)
        except _native.PathNotFoundError:
            # A missing file, in safetensors' words (its tests compare them); the class is the
            # library's, a `FileNotFoundError`.
            local = isinstance(filename, (str, os.PathLike)) and "://" not in os.fspath(filename)
            if local and not os.path.exists(filename):
                raise _native.PathNotFoundError(
                    f"No such file or directory: {os.fspath(filename)}"
                ) from None
            raise
        if isinstance(self._convert, ToNumpy):
            self._convert.views_of_mappings = self._reader.map_asked
        # The headers as read; a tensor's `TensorInfo` is made when asked for (`_info`), not
        # one per tensor at open (60,000 tensors: 1.6 us a tensor).
        self._checkpoint = self._reader.checkpoint()
        self._offset_keys = self._checkpoint.keys()
        self._position = {name: i for i, name in enumerate(self._offset_keys)}
        self._metadata = self._checkpoint.metadata()
        self._closed = False
        # Reading ahead (see `_READ_AHEAD_BELOW`): the tensor being read ahead, the position
        # of the last tensor asked for, and the threads that read ahead (made when needed).
        self._ahead_lock = threading.Lock()
        self._ahead: Optional[Tuple[str, Future[Any]]] = None
        self._last = -1
        self._ahead_thread: Optional[ThreadPoolExecutor] = None
        # Whether this handle's reads hand out mappings (no read ahead then).
        self._mapped = self._reader.maps

    def __enter__(self) -> safe_open:
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

    def _position_of(self, name: str) -> int:
        """`name`'s position in file order, for a name the handle has."""
        self._check_open()
        if not isinstance(name, str):
            raise TypeError(
                f"argument 'name': '{type(name).__name__}' object is not an instance of 'str'"
            )
        position = self._position.get(name)
        if position is None:
            raise SelectionError(f"File does not contain tensor {name}")
        return position

    def _info(self, name: str) -> Any:
        self._position_of(name)
        return self._checkpoint[name]

    def keys(self) -> List[str]:
        """The tensor names, sorted (as `safetensors` gives them)."""
        self._check_open()
        return sorted(self._offset_keys)

    def offset_keys(self) -> List[str]:
        """The tensor names in the order of their bytes (file by file when sharded)."""
        self._check_open()
        return list(self._offset_keys)

    def metadata(self) -> Optional[Dict[str, str]]:
        """The header's `__metadata__` (the first file's, when sharded), or None."""
        self._check_open()
        return None if self._metadata is None else dict(self._metadata)

    def get_tensor(self, name: str) -> Any:
        """The whole tensor `name`, read now.

        Asked for in file order, the next small tensor is read while the caller uses this one.

        Raises:
            SelectionError: the checkpoint has no tensor `name`.
            SafetensorError: the handle is closed.
        """
        with torch_out_of_memory(self._gpu):
            return self._get_tensor(name)

    def _get_tensor(self, name: str) -> Any:
        position = self._position_of(name)
        pending = self._read_ahead_after(name, position)
        staged = None
        if pending is not None:
            try:
                staged = pending.result()
            except Exception:
                # The read ahead ran on its own (a Ctrl-C then may have ended it): this call
                # reads the tensor itself, and a real error comes again from there.
                staged = None
        if staged is None:
            staged = self._reader.read(name, fast=self._convert.fast)
            if self._mapped and not self._reader.last_mapped:
                self._mapped = False  # no memory for a mapping: this handle reads ahead
        if isinstance(staged, _native._Staged):
            return self._convert.convert(staged, staged.dtype, list(staged.shape), name)
        return self._convert.converted(staged)  # made by `fast` already

    def _stream(self, names: List[str]) -> Iterator[Tuple[str, Any]]:
        """The tensors `names`, read in file order by one load on this handle's backend (as
        `stage` reads), as `(name, tensor)`: for a caller that reads ahead itself. Its reads
        count in `report()` once it ends; closing the handle ends it."""
        self._check_open()
        with torch_out_of_memory(self._gpu):
            for name, staged in self._reader.stream(names):
                yield name, self._convert.convert(staged, staged.dtype, list(staged.shape), name)

    def _read_ahead_after(self, name: str, position: int) -> Optional[Future[Any]]:
        """The read of `name` (at `position` in file order) already under way, if any; and the
        next tensor read ahead when `name` follows the last one asked for in file order."""
        with self._ahead_lock:
            pending = None
            if self._ahead is not None and self._ahead[0] == name:
                pending = self._ahead[1]
            self._ahead = None  # a read ahead not asked for next is dropped
            sequential = position == self._last + 1
            self._last = position
            following = position + 1
            if (
                sequential
                and not self._mapped
                and following < len(self._offset_keys)
                and not self._closed
            ):
                upcoming = self._offset_keys[following]
                if self._checkpoint[upcoming].nbytes < _READ_AHEAD_BELOW:
                    if self._ahead_thread is None:
                        self._ahead_thread = ThreadPoolExecutor(
                            # Two: the tensor asked for may still be being read ahead by one
                            # when the next is asked of the other.
                            2,
                            thread_name_prefix="safe_open-read-ahead",
                        )
                    try:
                        read = self._ahead_thread.submit(self._reader.read, upcoming)
                        self._ahead = (upcoming, read)
                    except RuntimeError:
                        # No thread for it ("can't start new thread": a limit on threads):
                        # nothing is read ahead; the reads themselves say what they lack.
                        pass
        return pending

    def get_slice(self, name: str) -> safe_slice:
        """The tensor `name`, not read yet: index it to read the rows the index needs.

        Raises:
            SelectionError: the checkpoint has no tensor `name`.
        """
        info = self._info(name)
        return safe_slice(self, name, info.dtype, list(info.shape))

    def get_tensors(self) -> Dict[str, Any]:
        """Every tensor, read in file order, by name."""
        return {name: self.get_tensor(name) for name in self.offset_keys()}

    def _slice(self, name: str, dtype: str, shape: List[int], key: Any) -> Any:
        self._check_open()
        # NumPy's and Flax's tensors are sliced by `safetensors` itself, by its own rules; torch's
        # by torch, whose rules the stand-in applies.
        with torch_out_of_memory(self._gpu):
            return read_slice(
                self._reader,
                self._convert,
                name,
                dtype,
                shape,
                key,
                as_safetensors=self._framework_name != "pt",
            )

    def report(self) -> Dict[str, Any]:
        """Every read so far, with the keys of `stage --json`.

        Returns:
            A dict with `bytes_read`, `read_requests`, `tensors`, `bytes`, `paths`,
            `backend`, `mode`, ...
        """
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
        state = "closed" if self._closed else f"{len(self._offset_keys)} tensors"
        return f"safe_open({self._framework_name}, {self.backend}, {state})"


class _safe_open_handle(safe_open):
    """`safetensors._safe_open_handle`: `safe_open` of an open file object (one with a
    `fileno`, as `open()` and fsspec's local files give), by its `name`, as `safetensors`
    does."""

    def __init__(self, f: Any, framework: Any, device: Any = "cpu", **options: Any) -> None:
        f.fileno  # noqa: B018  (an AttributeError for an object that is not a file, as theirs)
        super().__init__(f.name, framework, device, **options)
