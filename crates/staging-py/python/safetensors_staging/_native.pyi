"""Type stubs of the extension module (Rust, PyO3). The public API is in `__init__.py`."""

from os import PathLike
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

__version__: str
MALFORMED: List[str]

class StagingError(Exception):
    # Each class's own kind, a class attribute; an instance made from a library error carries
    # that error's kind (OutOfMemoryError: "device-allocation" or "host-allocation").
    kind: str
class MalformedCheckpointError(StagingError): ...
class ReadError(StagingError): ...
class PathNotFoundError(ReadError, FileNotFoundError): ...
class PathPermissionError(ReadError, PermissionError): ...
class BackendUnavailableError(StagingError): ...
class DeviceError(StagingError): ...
class InvalidOptionError(StagingError, ValueError): ...
class OutOfMemoryError(StagingError, MemoryError): ...
class SelectionError(StagingError): ...
class DestinationError(StagingError): ...
class UnsupportedDtypeError(StagingError, TypeError): ...

class TensorInfo:
    """One tensor's metadata."""

    name: str
    dtype: str
    shape: List[int]
    nbytes: int
    file: Path
    offset: int
    rows: Optional[Tuple[int, int]]

class Checkpoint:
    """A checkpoint's headers, nothing loaded."""

    files: List[Path]
    total_bytes: int
    def keys(self) -> List[str]: ...
    def tensors(self) -> List[TensorInfo]: ...
    def metadata(self) -> Optional[Dict[str, str]]: ...
    def file_metadata(self) -> List[Tuple[Path, Optional[Dict[str, str]]]]: ...
    def plan(self, ranks: int) -> Tuple[int, List[Tuple[str, int, int, int, Optional[Tuple[int, int]]]]]: ...
    def __len__(self) -> int: ...
    def __contains__(self, name: str) -> bool: ...
    def __getitem__(self, name: str) -> TensorInfo: ...
    def __iter__(self) -> Iterator[str]: ...
    def __enter__(self) -> "Checkpoint": ...
    def __exit__(self, *args: Any) -> bool: ...

class _Staged:
    """One loaded tensor owning its memory, exported through DLPack."""

    name: str
    dtype: str
    shape: List[int]
    nbytes: int
    path: str
    fallback: Optional[str]
    space: str
    byte_shape: List[int]
    dlpack_dtype: Optional[Tuple[int, int, int]]
    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Optional[Tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> Any: ...
    def __dlpack_device__(self) -> Tuple[int, int]: ...
    def as_bytes(self) -> "_Staged": ...

class _Load:
    """A load in progress."""

    backend: str
    total_bytes: int
    def __iter__(self) -> "_Load": ...
    def __next__(self) -> Tuple[str, Any]: ...
    def close(self) -> None: ...
    def report_json(self) -> str: ...
    def held(self) -> Dict[str, int]: ...

def _stage(
    paths: Sequence[Union[str, PathLike]],
    *,
    destination: Optional[Callable[[str, TensorInfo], Any]] = None,
    progress: bool = False,
    select: Union[None, str, Iterable[str], Callable[[str], bool]] = None,
    rows: Union[None, Dict[str, Any], Callable[[str, TensorInfo], Any]] = None,
    store_options: Optional[Dict[str, str]] = None,
    **options: Any,  # every other key of the library's LoadOptions
) -> _Load: ...
def _open(
    paths: Sequence[Union[str, PathLike]],
    *,
    store_options: Optional[Dict[str, str]] = None,
    **options: Any,
) -> Checkpoint: ...
def _options(**options: Any) -> str: ...
def _resolve_rows(spec: Any, dim0: int) -> Tuple[int, int]: ...

# The library's answers, which the Python layer asks for instead of deciding again.
def _select(
    paths: Sequence[Union[str, PathLike]],
    *,
    select: Union[None, str, Iterable[str], Callable[[str], bool]] = None,
    rows: Union[None, Dict[str, Any], Callable[[str, TensorInfo], Any]] = None,
    store_options: Optional[Dict[str, str]] = None,
    **options: Any,  # every other key of the library's LoadOptions
) -> Tuple[Checkpoint, List[TensorInfo]]:
    """The checkpoint (every tensor, whole) and the tensors a load with these keywords keeps,
    narrowed to their rows."""
def _is_url(path: Union[str, PathLike]) -> bool: ...
def _url_store(path: Union[str, PathLike]) -> Optional[str]:
    """"s3", "gcs", "azure" or "http": the store the remote backend reads the URL from; None
    for a path, or a URL of a scheme it does not read."""
def _redacted(text: str) -> str:
    """`text` with every URL in it without its login or query, as the library shows URLs."""
def _device(device: Any) -> Tuple[str, Optional[int]]:
    """(canonical spelling, GPU ordinal or None) of a device spelling, as a load reads it."""

class _Dtype:
    """One dtype of the format: its bits (the `safetensors` crate's) and its framework names."""

    name: str
    bits: int
    torch: Optional[str]
    numpy: Optional[str]
    ml_dtypes: Optional[str]

_DTYPES: Dict[str, _Dtype]

class _Reader:
    backend: str
    closed: bool
    def read(self, name: str, rows: Optional[Tuple[int, int]] = None) -> _Staged: ...
    def checkpoint(self) -> Checkpoint: ...
    def report_json(self) -> str: ...
    def close(self) -> None: ...

def _reader(paths: List[str], **options: Any) -> _Reader: ...
def _serialize(
    tensors: List[Tuple[str, str, List[int], Any]],
    metadata: Optional[Dict[str, str]] = None,
    filename: Optional[str] = None,
) -> Optional[bytes]: ...
def _parse(data: bytes) -> Tuple[int, List[Tuple[str, str, List[int], int, int]], Optional[Dict[str, str]]]: ...

# The load options as keywords: one per key of the library's table (`LoadOptions::specs()`),
# checked against `_option_table()` by tests/test_option_table.py. An alias of a key
# (`device_memory` for `memory_cap`) is accepted too; `None` keeps a default.
from typing import TypedDict

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
    direct_io: bool
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

def _option_table() -> List[Dict[str, Any]]:
    """The library's table of load options, one dict per key (`name`, `keyword`, `aliases`,
    `kind`, `value_name`, `choices`, `default`, `default_is_value`, `help`)."""
