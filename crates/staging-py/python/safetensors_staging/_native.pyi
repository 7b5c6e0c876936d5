"""Type stubs of the extension module (Rust, PyO3). The public API is in `__init__.py`.

Checked against the built module by `python -m mypy.stubtest safetensors_staging._native`.
"""

from functools import cached_property
from os import PathLike
from pathlib import Path
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    TypedDict,
    Union,
    final,
    type_check_only,
)

__all__ = [
    "StagingError",
    "MalformedCheckpointError",
    "ReadError",
    "BackendUnavailableError",
    "DeviceError",
    "PathNotFoundError",
    "PathPermissionError",
    "OutOfMemoryError",
    "InvalidOptionError",
    "SelectionError",
    "DestinationError",
    "UnsupportedDtypeError",
    "ResourceError",
    "_Staged",
    "_Fast",
    "_probe_staged",
    "_error_class",
    "TensorInfo",
    "Checkpoint",
    "_Load",
    "_Reader",
    "_serialize",
    "_parse",
    "_option_table",
    "_reader",
    "_stage",
    "_load_into",
    "_open",
    "_resolve_rows",
    "_options",
    "_Dtype",
    "_select",
    "_is_url",
    "_is_repo_id",
    "_hub_changes",
    "_hub_repository_path",
    "_url_store",
    "_redacted",
    "_device",
    "_DTYPES",
    "__version__",
]

__version__: str

class StagingError(Exception):
    """Every error of safetensors_staging.

    The message is one line naming the file, and the tensor and offset where there is one.
    Each subclass says what went wrong; `except SafetensorError` (the same class) works as
    with `safetensors`. Where the `safetensors` package is installed, this class also derives
    from `safetensors.SafetensorError`, so that `except safetensors.SafetensorError` catches
    these errors too.

    Attributes:
        kind: the library's kind of error (`"not-found"`, `"read"`, `"device-allocation"`,
            ...), on the class and on each instance (an instance made from a library error
            carries that error's kind: `OutOfMemoryError` is `"device-allocation"` or
            `"host-allocation"`).
        details: the longer story behind the one-line message, one str each: for a GPU asked
            for and none usable, each GPU backend passed over with its full reason
            (`"cufile: no CUDA driver: ..."`); empty for most errors.
    """

    kind: str
    @cached_property
    def details(self) -> List[str]:
        """Set on an instance made from a library error; an empty list otherwise."""

class MalformedCheckpointError(StagingError):
    """The checkpoint is not valid safetensors (header, index, offsets, a file shorter than its
    header says, a directory with no checkpoint)."""

class ReadError(StagingError):
    """A file could not be opened or read, or changed during the load."""

class PathNotFoundError(ReadError, FileNotFoundError):
    """A path (a file, a directory, an object) does not exist."""

class PathPermissionError(ReadError, PermissionError):
    """A path may not be opened by this process."""

class BackendUnavailableError(StagingError):
    """The backend or device asked for cannot run here (no driver, no device, no library)."""

class DeviceError(StagingError):
    """A device operation (a memory query, a copy) failed."""

class InvalidOptionError(StagingError, ValueError):
    """An option's value does not parse or does not go with the others."""

class OutOfMemoryError(StagingError, MemoryError):
    """An allocation failed where the policy had no fallback left."""

class SelectionError(StagingError):
    """A selection names a tensor the checkpoint does not hold, or rows a tensor lacks."""

class DestinationError(StagingError):
    """The destination callback failed, or gave memory of the wrong device, layout or size."""

class UnsupportedDtypeError(StagingError, TypeError):
    """The framework asked for has no dtype for this tensor (NumPy has no bfloat16 or
    float8)."""

class ResourceError(StagingError, OSError):
    """The system refused a resource the load needs to run: its threads (a limit on
    processes or threads, memory for their stacks) or descriptors; `errno` is the system's
    code."""

@final
class TensorInfo:
    """One tensor's metadata: name, dtype, shape, bytes, file and offset."""

    @property
    def name(self) -> str:
        """The tensor's name."""
    @property
    def dtype(self) -> str:
        """Its dtype as the format writes it (`"BF16"`)."""
    @property
    def shape(self) -> List[int]:
        """Its shape."""
    @property
    def nbytes(self) -> int:
        """Its length in bytes."""
    @property
    def file(self) -> Union[Path, str]:
        """The file that holds it (a `pathlib.Path`, or a `str` for a URL)."""
    @property
    def offset(self) -> int:
        """The absolute offset of its first byte in the file."""
    @property
    def rows(self) -> Optional[Tuple[int, int]]:
        """The rows of dimension 0 it covers, when only a range of them is loaded."""

@final
class Checkpoint:
    """A checkpoint's headers, read and checked, with nothing loaded: what `open(path)` returns.

    A context manager, like `safetensors.safe_open`; `name in ckpt`, `ckpt[name]` (a
    `TensorInfo`), `len(ckpt)` and iterating its names work too.
    """

    @property
    def files(self) -> List[Union[Path, str]]:
        """The checkpoint's files, in load order (a `str` for a URL)."""
    @property
    def total_bytes(self) -> int:
        """The bytes of every tensor together."""
    def keys(self) -> List[str]:
        """The tensor names, in file order."""
    def tensors(self) -> List[TensorInfo]:
        """Every tensor's metadata, in file order."""
    def metadata(self) -> Optional[Dict[str, str]]:
        """The first file's `__metadata__` (like `safe_open(...).metadata()`), or None."""
    def file_metadata(self) -> List[Tuple[Union[Path, str], Optional[Dict[str, str]]]]:
        """Every file's `__metadata__`, by file."""
    def plan(
        self, ranks: int
    ) -> Tuple[int, List[Tuple[str, int, int, int, Optional[Tuple[int, int]]]]]:
        """The partition plan for a group of `ranks`, the same on every rank.

        Returns:
            `(fingerprint, pieces)`, each piece `(name, offset, len, owner, rows)` in
            checkpoint order (`rows`: `(start, end)` for a tensor split between ranks, else
            None).
        """
    def __len__(self) -> int: ...
    def __contains__(self, key: str, /) -> bool: ...
    def __getitem__(self, key: str, /) -> TensorInfo: ...
    def __iter__(self) -> Iterator[str]: ...
    def __enter__(self) -> Checkpoint: ...
    def __exit__(self, *_args: Any) -> bool: ...

@final
class _Staged:
    """One loaded tensor owning its memory, exported through DLPack."""

    @property
    def name(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def shape(self) -> List[int]: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def path(self) -> str: ...
    @property
    def fallback(self) -> Optional[str]: ...
    @property
    def space(self) -> str: ...
    @property
    def byte_shape(self) -> List[int]: ...
    @property
    def dlpack_dtype(self) -> Optional[Tuple[int, int, int]]: ...
    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Optional[Tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> Any: ...
    def __dlpack_device__(self) -> Tuple[int, int]: ...
    def as_bytes(self) -> _Staged: ...

@final
class _Fast:
    """Loaded tensors made into a framework's tensors from Rust, for the dtypes given."""

    def __new__(
        cls, example: Any, from_capsule: Callable[[Any], Any], dtypes: List[str]
    ) -> _Fast: ...
    @property
    def exchange(self) -> bool: ...
    @property
    def dtypes(self) -> List[str]: ...
    def convert(self, staged: _Staged) -> Optional[Any]: ...

def _probe_staged(dtype: str) -> _Staged: ...
def _error_class(kind: str) -> type: ...

@final
class _Load:
    """A load in progress."""

    @property
    def backend(self) -> str: ...
    @property
    def total_bytes(self) -> int: ...
    def __iter__(self) -> _Load: ...
    def __next__(self) -> Tuple[str, Any]: ...
    def take(
        self,
        most: int,
        bytes: int,
        fast: Optional[_Fast] = None,
        convert: Optional[Callable[[_Staged], Any]] = None,
    ) -> List[Tuple[str, Any]]:
        """Up to `most` tensors, fewer once they hold `bytes` (`[]` once the load ended), each
        `fast`'s tensor where `fast` converts it, else `convert(staged)` when given, else as
        `__next__` gives it."""
    def close(self) -> None: ...
    def report_json(self) -> str: ...
    def held(self) -> Dict[str, int]: ...

def _stage(
    paths: Sequence[Union[str, PathLike[str]]],
    *,
    destination: Optional[Callable[[str, TensorInfo], Any]] = None,
    progress: bool = False,
    select: Union[None, str, Iterable[str], Callable[[str], bool]] = None,
    rows: Union[None, Dict[str, Any], Callable[[str, TensorInfo], Any]] = None,
    store_options: Optional[Dict[str, str]] = None,
    **options: Any,  # every other key of the library's LoadOptions
) -> _Load: ...
def _load_into(
    paths: Sequence[Union[str, PathLike[str]]],
    targets: Sequence[Tuple[str, int, int, str, Sequence[int]]],
    *,
    _between: Optional[Callable[[], bool]] = None,
    **options: Any,  # every key of the library's LoadOptions (device, rows, remote keys)
) -> Tuple[List[str], str]:
    """Reads the checkpoint into `targets` (name, address, bytes, dtype, shape), in place, in
    one call; returns the names written, in order, and the report as JSON. A failure after
    writing began raises its cause with `written`, `partly_written` and `unchanged`."""

def _open(
    paths: Sequence[Union[str, PathLike[str]]],
    *,
    store_options: Optional[Dict[str, str]] = None,
    **options: Any,
) -> Checkpoint: ...
def _options(**options: Any) -> str: ...
def _resolve_rows(spec: Any, dim0: int) -> Tuple[int, int]: ...

# The library's answers, which the Python layer asks for instead of deciding again.
def _select(
    paths: Sequence[Union[str, PathLike[str]]],
    *,
    select: Union[None, str, Iterable[str], Callable[[str], bool]] = None,
    rows: Union[None, Dict[str, Any], Callable[[str, TensorInfo], Any]] = None,
    store_options: Optional[Dict[str, str]] = None,
    **options: Any,  # every other key of the library's LoadOptions
) -> Tuple[Checkpoint, List[TensorInfo]]:
    """The checkpoint (every tensor, whole) and the tensors a load with these keywords keeps,
    narrowed to their rows."""

def _is_url(path: Union[str, PathLike[str]]) -> bool: ...
def _is_repo_id(name: str) -> bool: ...
def _hub_changes(path: Union[str, PathLike[str]], since: str, **kwargs: Any) -> Dict[str, Any]: ...
def _hub_repository_path(file: Union[str, PathLike[str]], commit: str) -> Optional[str]: ...
def _url_store(path: Union[str, PathLike[str]]) -> Optional[str]:
    """ "s3", "gcs", "azure" or "http": the store the remote backend reads the URL from; None
    for a path, or a URL of a scheme it does not read."""

def _redacted(text: str) -> str:
    """`text` with every URL in it without its login or query, as the library shows URLs."""

def _device(value: Any) -> Tuple[str, Optional[int]]:
    """(canonical spelling, GPU ordinal or None) of a device spelling, as a load reads it."""

@final
class _Dtype:
    """One dtype of the format: its bits (the `safetensors` crate's) and its framework names."""

    @property
    def name(self) -> str: ...
    @property
    def bits(self) -> int: ...
    @property
    def torch(self) -> Optional[str]: ...
    @property
    def numpy(self) -> Optional[str]: ...
    @property
    def ml_dtypes(self) -> Optional[str]: ...

_DTYPES: Dict[str, _Dtype]

@final
class _Reader:
    """An open checkpoint that reads one tensor (or rows of it) at a time: `safe_open`'s."""

    @property
    def backend(self) -> str: ...
    @property
    def closed(self) -> bool: ...
    @property
    def maps(self) -> bool: ...
    @property
    def map_asked(self) -> bool: ...
    @property
    def last_mapped(self) -> bool: ...
    def read(
        self,
        name: str,
        rows: Optional[Tuple[int, int]] = None,
        columns: Optional[Tuple[int, int]] = None,
        fast: Optional[_Fast] = None,
    ) -> Any:
        """The tensor `name` as a `_Staged`, or `fast`'s tensor where `fast` converts it."""
    def read_columns(
        self, name: str, rows: Optional[Tuple[int, int]], columns: Tuple[int, int]
    ) -> Optional[_Staged]: ...
    def stream(self, names: List[str]) -> _Load:
        """The tensors `names` read in file order by one load on this handle's backend: its
        report is added to the handle's when it ends; closing either ends both."""
    def checkpoint(self) -> Checkpoint: ...
    def report_json(self) -> str: ...
    def close(self) -> None: ...

def _reader(paths: List[str], **options: Any) -> _Reader: ...
def _serialize(
    tensors: List[Tuple[str, str, List[int], Any]],
    metadata: Optional[Dict[str, str]] = None,
    filename: Optional[str] = None,
) -> Optional[bytes]: ...
def _parse(
    data: bytes,
) -> Tuple[int, List[Tuple[str, str, List[int], int, int]], Optional[Dict[str, str]]]: ...

# The load options as keywords: one per key of the library's table (`LoadOptions::specs()`),
# checked against `_option_table()` by tests/doors/test_option_table.py. An alias of a key
# (`device_memory` for `memory_cap`) is accepted too; `None` keeps a default.
@type_check_only
class LoadOptions(TypedDict, total=False):
    backend: str
    device: Any  # "auto", "cpu", "cuda:N", an int or a torch.device
    memory_cap: Union[int, str]
    chunk_size: Union[int, str]
    staging_size: Union[int, str]
    headroom_min: Union[int, str]
    headroom_divisor: int
    threads: int
    staging_slots: int
    coalesce_below: Union[int, str]
    suballocate: bool
    host_assembly: bool
    direct_io: bool
    map: Union[bool, str]  # "auto" (default), True, False
    cufile_mode: str
    cufile_lib: Union[str, PathLike[str]]
    hipfile_mode: str
    hipfile_lib: Union[str, PathLike[str]]
    hip_lib: Union[str, PathLike[str]]
    select: Union[str, Iterable[str], Callable[[str], bool]]
    rows: Union[Mapping[str, Union[Tuple[int, int], str]], Callable[[str, TensorInfo], Any]]
    concurrency: int
    range_size: Union[int, str]
    retries: int
    bandwidth: Union[int, str]
    store_options: Mapping[str, str]
    allow_redirect: Union[str, Iterable[str]]
    cache: bool
    cache_dir: Union[str, PathLike[str]]

def _option_table() -> List[Dict[str, Any]]:
    """The library's table of load options, one dict per key (`name`, `keyword`, `aliases`,
    `kind`, `value_name`, `choices`, `default`, `default_is_value`, `help`)."""
