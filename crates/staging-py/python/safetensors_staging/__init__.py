"""Load safetensors checkpoints onto a GPU (cuFile, hipFile) or into host memory, with bounded
memory and exact bytes; tensors handed to PyTorch and NumPy through DLPack, zero-copy.

    import safetensors_staging as st

    weights = st.load_file("model_dir", device="cuda:0")      # dict[str, torch.Tensor]
    for name, tensor in (it := st.stage("model_dir", device="cuda:0")):
        ...                                                   # vLLM-style weight iterator
    print(it.report()["bytes_read"])
    with st.open("model_dir") as ckpt:                        # metadata, nothing loaded
        print(ckpt.keys(), ckpt["lm_head.weight"].shape, ckpt.metadata())
    with st.safe_open("model.safetensors", framework="pt", device="cuda:0") as f:
        w = f.get_slice("lm_head.weight")[0:512]              # safetensors' API; reads 512 rows

`safetensors_staging.torch`, `.numpy` and `.flax` have the functions of `safetensors.torch`,
`.numpy` and `.flax` (`load_file`, `load`, `save_file`, `save`; `save_model` and
`load_model` for torch): code written for `safetensors` switches by changing its import.

`path` is a `.safetensors` file, a directory (its `model.safetensors.index.json`, else its
`.safetensors` files), an index file, or a list of files. Everything is decided by the Rust
library's one entry point (`safetensors_staging::Loader`), as for the `stage` command: the
backend (`auto`: cuFile, then hipFile), the staging policy (a tensor goes into its own device
buffer when free memory leaves headroom, else it is assembled in host memory through one
bounded staging buffer), and what a read error means (an exception naming the tensor, file and
offset; nothing half-read is handed out).

Every tensor owns its memory: dropping its last reference gives it back to the library.
A tensor that the policy assembled in host memory (device memory ran short) comes back as a
CPU tensor even when a GPU was asked for; `report()["fallbacks"]` counts them.
"""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple, Union

from . import _native
from ._native import (
    BackendUnavailableError,
    Checkpoint,
    DestinationError,
    DeviceError,
    InvalidOptionError,
    MalformedCheckpointError,
    OutOfMemoryError,
    PathNotFoundError,
    PathPermissionError,
    ReadError,
    SelectionError,
    StagingError,
    TensorInfo,
    UnsupportedDtypeError,
    __version__,
    _DTYPES,
)

if TYPE_CHECKING:
    import torch

__all__ = [
    "BackendUnavailableError",
    "Checkpoint",
    "DestinationError",
    "DeviceError",
    "InvalidOptionError",
    "MalformedCheckpointError",
    "OutOfMemoryError",
    "PathNotFoundError",
    "PathPermissionError",
    "ReadError",
    "SafetensorError",
    "SelectionError",
    "Stage",
    "StagingError",
    "TensorInfo",
    "UnsupportedDtypeError",
    "__version__",
    "load_file",
    "open",
    "safe_open",
    "safe_slice",
    "stage",
]

PathLike = Union[str, "os.PathLike[str]"]
Paths = Union[PathLike, Iterable[PathLike]]
RowSpec = Union[Tuple[int, int], str]

def _paths(path: Paths) -> List[str]:
    if isinstance(path, (str, bytes, os.PathLike)):
        return [os.fsdecode(os.fspath(path))]
    paths = [os.fsdecode(os.fspath(p)) for p in path]
    if not paths:
        raise ValueError("path: an empty list of files")
    return paths


def _device(device: Any) -> Tuple[str, Optional[int]]:
    """`device` as the library reads it ("cpu", "auto", "cuda", "cuda:N", "hip:N", an int, a
    `torch.device`): its spelling and GPU ordinal (None for "cpu" and "auto"), or the library's
    `InvalidOptionError`. Only "cuda" alone is resolved here, to torch's current CUDA device,
    which the library cannot see."""
    if str(device) == "cuda":
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            device = int(torch.cuda.current_device())
    spelled, gpu = _native._device(device)
    return spelled, gpu


def _torch_device(gpu: Optional[int]) -> "torch.device":
    """torch's device for a GPU ordinal (torch calls ROCm GPUs "cuda" too), or the CPU."""
    import torch

    return torch.device("cpu") if gpu is None else torch.device("cuda", gpu)


def _to_torch(staged: Any, unsupported_dtypes: str) -> "torch.Tensor":
    """A loaded tensor as torch's: its bytes through DLPack, viewed as torch's dtype (zero-copy,
    and whatever DLPack types the installed torch imports)."""
    import torch

    raw = torch.from_dlpack(staged.as_bytes())
    return _torch_from_bytes(raw, staged.dtype, list(staged.shape), unsupported_dtypes, staged.name)


def _torch_view(dtype: str, shape: List[int], unsupported_dtypes: str, name: str) -> Tuple[Any, List[int]]:
    """The torch dtype and shape a tensor's bytes are viewed as: `(None, byte shape)` for its
    bytes as `uint8` when asked for; raises `UnsupportedDtypeError` when torch has no dtype."""
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
        f"(shape {list(shape)}); pass unsupported_dtypes=\"uint8\" for its bytes"
    )


def _torch_from_bytes(buffer: "torch.Tensor", dtype: str, shape: List[int], unsupported_dtypes: str, name: str) -> "torch.Tensor":
    """A `uint8` tensor of a tensor's bytes, viewed as its dtype and shape (zero-copy)."""
    target, shape = _torch_view(dtype, shape, unsupported_dtypes, name)
    return buffer.reshape(shape) if target is None else buffer.view(target).reshape(shape)


def _to_numpy(staged: Any, unsupported_dtypes: str) -> Any:
    import numpy

    if _DTYPES[staged.dtype].numpy is not None:
        return numpy.from_dlpack(staged)
    if unsupported_dtypes == "uint8":
        return numpy.from_dlpack(staged.as_bytes())
    raise UnsupportedDtypeError(
        f"tensor {staged.name!r}: NumPy has no dtype for {staged.dtype}; pass "
        "unsupported_dtypes=\"uint8\" for its bytes (then .view(ml_dtypes.bfloat16), for example)"
    )


class Stage:
    """A load in progress: an iterator of `(name, tensor)` in file order, the form vLLM's weight
    iterators take. `report()` gives the same keys as `stage --json`; `close()` (or leaving a
    `with` block, or an exception, or `KeyboardInterrupt`) ends the load and frees what it held.
    """

    def __init__(self, native: Any, convert: Callable[[Any], Any]) -> None:
        self._native = native
        self._convert = convert

    def __iter__(self) -> "Stage":
        return self

    def __next__(self) -> Tuple[str, Any]:
        name, obj = next(self._native)
        if isinstance(obj, _native._Staged):
            try:
                obj = self._convert(obj)
            except BaseException:
                self.close()
                raise
        return name, obj

    def __enter__(self) -> "Stage":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Ends the load; tensors already handed out stay valid."""
        self._native.close()

    def report(self) -> Dict[str, Any]:
        """What the load did, with the keys of `stage --json`: `backend`, `mode`, `passed_over`,
        `mode_reason`, `files`, `tensors`, `bytes`, `seconds`, `bytes_per_second`, `paths`,
        `fallbacks`, `peak_device_bytes`, `taken_device_bytes`, `peak_host_bytes`,
        `read_requests`, `bytes_read`, `tensor_list`."""
        return json.loads(self._native.report_json())

    @property
    def backend(self) -> str:
        """The backend chosen: `host`, `cufile` or `hipfile`."""
        return self._native.backend

    @property
    def total_bytes(self) -> int:
        """The bytes of every selected tensor together (0 once the load has ended)."""
        return self._native.total_bytes

    def held(self) -> Dict[str, int]:
        """Bytes the load's buffers hold now: `device`, `host` (the library's) and `caller`
        (handed out as device tensors and not yet dropped). All 0 once every tensor is gone."""
        return dict(self._native.held())



def _stage(
    path: Paths,
    device: str,
    convert: Callable[[Any], Any],
    *,
    destination: Optional[Callable[[str, TensorInfo], Any]] = None,
    progress: bool = False,
    rows: Union[None, Mapping[str, RowSpec], Callable[[str, TensorInfo], Optional[RowSpec]]] = None,
    store_options: Optional[Mapping[str, str]] = None,
    **options: Any,
) -> Stage:
    # Every other keyword is a key of the library's options, spelled and parsed there (an
    # unknown one is a TypeError, a bad value an InvalidOptionError).
    if rows is not None and not callable(rows):
        rows = dict(rows)
    native = _native._stage(
        _paths(path),
        destination=destination,
        progress=progress,
        device=device,
        rows=rows,
        store_options=None if store_options is None else dict(store_options),
        **options,
    )
    return Stage(native, convert)


def stage(
    path: Paths,
    device: Any = "cpu",
    *,
    unsupported_dtypes: str = "raise",
    process_group: Any = None,
    relay_chunk: int = 64 << 20,
    batch_bytes: int = 256 << 20,
    **options: Any,
) -> Any:
    """Loads a checkpoint, yielding `(name, torch.Tensor)` in file order as each tensor lands.

    device: "cpu" (host memory, the `host` backend; the default, as in `safetensors`), "cuda",
        "cuda:N", an int or a `torch.device` (a GPU: backend `auto` picks cuFile, then hipFile;
        none usable raises `BackendUnavailableError` naming why each was passed over),
        "hip:N" (hipFile only), or "auto" (a GPU when one is usable, else host memory).
    Every keyword below but `destination`, `progress` and the process-group ones is a key of the
    library's options, parsed by the library as the `stage` command's `--KEY` flag and C's
    `stg_config_set(config, "KEY", value)` are: the same settings mean the same load in every
    language. A value it does not parse raises `InvalidOptionError` (a `ValueError`).
    backend: "auto", "host", "cufile", "hipfile".
    select: tensor names or globs to load (`"model.layers.0.*"`; a name without glob characters
        must exist, else `SelectionError`), or a function of a name returning whether to load
        it. Unselected bytes are never read.
    rows: rows of dimension 0 to load, by name or glob: `{"w": (0, 512)}`, `{"w": "0:512"}` or
        `{"w": "1/4"}` (part 1 of 4 near-equal parts, as `numpy.array_split`); or a function of
        `(name, TensorInfo)` returning such a range or None.
    destination: a function of `(name, TensorInfo)` returning a contiguous, writable tensor (or
        NumPy array, or any DLPack array) on the load's device to read that tensor's bytes into,
        or None to let the library allocate. The object returned is the one yielded; it must
        not be touched until then. Its dtype and shape are the caller's choice; it must hold at
        least `TensorInfo.nbytes`. The library takes it through DLPack and checks device,
        contiguity, writability, dtype and size itself. A CUDA tensor is imported for the
        device's default stream, which torch orders after its current stream, and that stream
        is synchronized before anything is written: work queued on the tensor's current stream
        before the callback returned is finished first; work on other streams is the caller's
        to finish. From inside the callback, the load's `report()`, `backend`, `total_bytes`
        and `held()` work (the report as of the last tensor handed out), `close()` ends the
        load before this tensor is read, and iterating the load raises `StagingError`.
    memory_cap: bytes of device memory the load may use (the GPU's free memory is replaced by
        this budget; for "cpu" the capacity of the host backend's device buffers). Tensors that
        do not fit take the host path.
    chunk_size, staging_size, headroom_min, headroom_divisor, threads, staging_slots,
    coalesce_below, direct_io, suballocate, cufile_mode, cufile_lib, hipfile_mode, hipfile_lib,
    hip_lib: the staging policy and backend options, as the `stage` command's flags. A URL
        is read with at least min(concurrency, 8) threads (they wait on the network).
    progress: a progress bar with GB/s on stderr, when stderr is a terminal.
    concurrency, range_size, retries, bandwidth, store_options: for a path that is a URL the
        library reads (`s3://`, `gs://`, `az://`, `http(s)://`, ...; a prefix stands for a
        directory): ranged GETs in flight (default 16), bytes per GET (default 8 MiB), retries
        of a transient failure (default 5), a cap in bytes per second, and object_store options
        such as `{"aws_endpoint": "http://127.0.0.1:9000"}` applied after the cloud's own
        environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`,
        `AWS_REGION`, `AWS_ENDPOINT_URL`, ...). Secret options never appear in an error or
        dump, nor does a login in an `http(s)://user:password@host/` URL (sent to that host as
        Basic authentication).
    allow_redirect: for a URL, a host (or a list of them: `"cdn.example.com"`,
        `"*.example.com"`, `"*"`) a redirect may lead to besides the one asked for; any other
        redirect to another host is refused. The report's `redirects` lists those followed.
    unsupported_dtypes: "raise" (an `UnsupportedDtypeError` for F6 tensors, which torch has
        no dtype for) or "uint8" (such tensors as `uint8` of their bytes, last dimension widened
        to bytes).
    process_group: a `torch.distributed` process group (or True for the default group): every
        rank of it must make the same call. The checkpoint is read once across the group (each
        rank about 1/n of the bytes, by the library's partition plan) and every piece reaches
        every rank by broadcast, in `relay_chunk`-byte pieces, status agreed before and after
        every `batch_bytes` of exchange (a failure on one rank raises on all, within seconds).
        `select` and `rows` say what this rank keeps, as for a load without a group; the
        remote keywords apply too. The report adds `bytes_received`. gloo needs
        device="cpu", NCCL a GPU. Every rank must iterate to the end (`load_file` does).
    """
    if unsupported_dtypes not in ("raise", "uint8"):
        raise InvalidOptionError(f"unsupported_dtypes={unsupported_dtypes!r}: expected \"raise\" or \"uint8\"")
    spelled, gpu = _device(device)
    if process_group is not None:
        return _stage_in_group(path, spelled, gpu, process_group, unsupported_dtypes, relay_chunk, batch_bytes,
                               options)
    return _stage(path, spelled, lambda staged: _to_torch(staged, unsupported_dtypes), **options)


def _stage_in_group(
    path: Paths, device: str, gpu: Optional[int], group: Any, unsupported_dtypes: str, relay_chunk: int,
    batch_bytes: int, options: Dict[str, Any],
) -> Any:
    from . import _distributed

    if options.get("destination") is not None:
        raise InvalidOptionError("destination= is not supported with process_group= yet")
    options.pop("destination", None)
    selection = {"select": options.pop("select", None), "rows": options.pop("rows", None)}
    if selection["rows"] is not None and not callable(selection["rows"]):
        selection["rows"] = dict(selection["rows"])
    paths = _paths(path)
    # The library says what this rank keeps, given the load's own keywords (the remote ones
    # too); `progress` is this door's alone.
    asked = {key: value for key, value in options.items() if key != "progress"}
    if asked.get("store_options") is not None:
        asked["store_options"] = dict(asked["store_options"])

    def open_kept() -> Tuple[Checkpoint, List[TensorInfo]]:
        return _native._select(paths, device=device, **selection, **asked)

    def open_own(select: Callable[[str], bool], rows: Callable[[str, TensorInfo], Any]) -> Stage:
        return _stage(paths, device, lambda staged: staged, select=select, rows=rows, **options)

    def to_torch(buffer: Any, dtype: str, shape: List[int], name: str) -> Any:
        return _torch_from_bytes(buffer, dtype, shape, unsupported_dtypes, name)

    def check(dtype: str, shape: List[int], name: str) -> None:
        # Before any exchange: a tensor this rank could not hand over fails every rank now,
        # not this one alone in the middle of the exchange.
        _torch_view(dtype, shape, unsupported_dtypes, name)

    return _distributed.stage_group(gpu, group, open_kept, open_own, to_torch, check, relay_chunk, batch_bytes)


def load_file(path: Paths, device: Any = "cpu", **options: Any) -> Dict[str, "torch.Tensor"]:
    """Loads a checkpoint into `{name: torch.Tensor}`, like `safetensors.torch.load_file`.
    Takes every keyword of `stage`."""
    with stage(path, device, **options) as tensors:
        return dict(tensors)


def open(path: Paths, **remote: Any) -> Checkpoint:
    """A checkpoint's metadata with nothing loaded: `keys()`, `ckpt[name]` (a `TensorInfo`:
    dtype, shape, nbytes, file, offset), `metadata()` (`__metadata__`), `files`,
    `total_bytes`. A context manager, like `safetensors.safe_open`. For a URL, `stage`'s
    remote keywords apply (`concurrency`, `range_size`, `retries`, `bandwidth`,
    `store_options`)."""
    if "store_options" in remote and remote["store_options"] is not None:
        remote["store_options"] = dict(remote["store_options"])
    return _native._open(_paths(path), **remote)


# The drop-in for `safetensors` (`safe_open`, `SafetensorError`); after the helpers it uses.
from ._compat import SafetensorError, safe_open, safe_slice  # noqa: E402
