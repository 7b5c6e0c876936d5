"""Type stubs of the extension module (Rust, PyO3). The public API is in `__init__.py`."""

from os import PathLike
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

__version__: str
MALFORMED: List[str]

class StagingError(Exception): ...
class MalformedCheckpointError(StagingError): ...
class ReadError(StagingError): ...
class BackendUnavailableError(StagingError): ...
class OutOfMemoryError(StagingError): ...
class SelectionError(StagingError): ...
class DestinationError(StagingError): ...
class UnsupportedDtypeError(StagingError): ...

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
    def ledger_outstanding(self) -> Optional[Tuple[int, int]]: ...

def _stage(
    paths: Sequence[Union[str, PathLike]],
    *,
    gpu: Optional[int] = None,
    backend_name: str = "auto",
    select: Union[None, Iterable[str], Callable[[str], bool]] = None,
    rows: Union[None, Mapping[str, Any], Callable[[str, TensorInfo], Any]] = None,
    destination: Optional[Callable[[str, TensorInfo], Any]] = None,
    memory_cap: Optional[int] = None,
    chunk_size: Optional[int] = None,
    threads: Optional[int] = None,
    staging_slots: Optional[int] = None,
    coalesce_below: Optional[int] = None,
    direct_io: bool = False,
    suballocate: bool = True,
    cufile_mode: str = "auto",
    cufile_lib: Optional[str] = None,
    progress: bool = False,
    concurrency: Optional[int] = None,
    range_size: Optional[int] = None,
    retries: Optional[int] = None,
    bandwidth: Optional[int] = None,
    store_options: Optional[Dict[str, str]] = None,
) -> _Load: ...
def _open(
    paths: Sequence[Union[str, PathLike]],
    *,
    concurrency: Optional[int] = None,
    range_size: Optional[int] = None,
    retries: Optional[int] = None,
    bandwidth: Optional[int] = None,
    store_options: Optional[Dict[str, str]] = None,
) -> Checkpoint: ...
def _resolve_rows(spec: Any, dim0: int) -> Tuple[int, int]: ...
def _write_malformed(case: str, dir: Union[str, PathLike]) -> List[Path]: ...
