"""Loads as Python sees them: `stage` (an iterator of tensors), `load_file` and `open`."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import threading
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Tuple,
    Union,
)

from . import _native
from ._convert import (
    on_the_device,
    to_torch,
    torch_fast,
    torch_from_bytes,
    torch_out_of_memory,
    written_in_place,
)
from ._device import resolve_device
from ._dtypes import check_unsupported_dtypes, torch_view
from ._native import Checkpoint, InvalidOptionError, TensorInfo
from ._requires import need

if TYPE_CHECKING:
    import torch

PathLike = Union[str, "os.PathLike[str]"]
Paths = Union[PathLike, Iterable[PathLike]]
RowSpec = Union[Tuple[int, int], str]


def paths_of(path: Paths) -> List[str]:
    """`path` (one path or several) as the list of text paths the library takes."""
    if isinstance(path, (str, bytes, os.PathLike)):
        return [os.fsdecode(os.fspath(path))]
    paths = [os.fsdecode(os.fspath(p)) for p in path]
    if not paths:
        raise ValueError("path: an empty list of files")
    return paths


def copy_unless_mapping_asked(options: Dict[str, Any]) -> None:
    """NumPy's and Flax's arrays are copies, as `safetensors`' are: `map` left out (or
    `"auto"`, which for torch maps) becomes `False`; only `map=True` maps the file."""
    asked = options.get("map")
    if asked is None or (isinstance(asked, str) and asked.strip().lower() == "auto"):
        options["map"] = False


# What `Stage` takes from the load at once (`_native._Load.take`): iterating, one tensor, read
# when it is asked for (a stalled read, a Ctrl-C, `close()` and `report()` concern that tensor);
# for `load_file` (`Stage.all`), up to `_ALL_MOST` tensors or `_ALL_BYTES`, between which
# Ctrl-C is checked.
_ALL_MOST = 4096
_ALL_BYTES = 256 << 20


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused meanwhile, where that touches no other thread:
    only when the calling thread is the process's one Python thread (another would run without
    the collector, and a `gc.disable()` it made meanwhile would be undone at the end), and only
    when the collector is on; resumed only where this paused it. `safetensors` never touches
    the collector: with any other thread alive, neither does this."""
    # Both counts: `threading`'s threads, and every thread running Python now (one started by
    # `_thread` or by C code is not in `threading`'s).
    alone = threading.active_count() == 1 and len(sys._current_frames()) == 1
    pause = gc.isenabled() and alone
    if pause:
        gc.disable()
    try:
        yield
    finally:
        if pause:
            gc.enable()


class Stage:
    """A load in progress: an iterator of `(name, tensor)` in file order.

    The form vLLM's weight iterators take. `close()` (or leaving a `with` block, an exception,
    or `KeyboardInterrupt`) ends the load and frees what it held; tensors already handed out
    stay valid.

    Example:
        ```python
        with st.stage("model_dir", device="cuda:0") as tensors:
            for name, tensor in tensors:
                ...
            print(tensors.report()["bytes_read"])
        ```
    """

    def __init__(
        self,
        native: Any,
        convert: Callable[[Any], Any],
        fast: Optional[Any] = None,
        one_by_one: bool = False,
    ) -> None:
        self._native = native
        self._convert = convert
        self._fast = fast
        # Whether `all()` takes one tensor at a time (where a destination is given).
        self._one_by_one = one_by_one

    def __iter__(self) -> Stage:
        return self

    def __next__(self) -> Tuple[str, Any]:
        # A conversion that raises ends the load (`take` does), as a failed read does.
        got = self._native.take(1, 0, self._fast, self._convert)
        if not got:
            raise StopIteration
        return got[0]

    def all(self) -> Dict[str, Any]:
        """Every tensor not handed out yet, by name, in file order: taken in batches, with no
        Python between two tensors (destinations are asked for a batch's tensors before any
        is handed out, so `load_file` takes them one at a time)."""
        out: Dict[str, Any] = {}
        most, size = (1, 0) if self._one_by_one else (_ALL_MOST, _ALL_BYTES)
        # Python's cyclic garbage collector is paused meanwhile where no other thread runs
        # (`gc_paused`): the objects made are tensors, freed by reference counting, and the
        # collections their number set off found nothing to free while costing a third of the
        # time (60,000 tensors kept by the caller, one process: 0.15 s paused, 0.23-0.36 s not).
        with gc_paused():
            while True:
                got = self._native.take(most, size, self._fast, self._convert)
                if not got:
                    return out
                out.update(got)

    def __enter__(self) -> Stage:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Ends the load; tensors already handed out stay valid."""
        self._native.close()

    def report(self) -> Dict[str, Any]:
        """What the load did, with the keys of `stage --json`.

        Returns:
            A dict with `backend`, `mode`, `passed_over`, `mode_reason`, `files`, `tensors`,
            `bytes`, `seconds`, `bytes_per_second`, `paths`, `fallbacks`, `peak_device_bytes`,
            `taken_device_bytes`, `peak_host_bytes`, `read_requests`, `bytes_read`,
            `tensor_list` (and `redirects` for a URL).
        """
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
        """Bytes the load's buffers hold now.

        Returns:
            `device` and `host` (the library's buffers) and `caller` (handed out as device
            tensors and not yet dropped); all 0 once every tensor is gone.
        """
        return dict(self._native.held())


def _writing_into(
    destination: Callable[[str, TensorInfo], Any],
) -> Callable[[str, TensorInfo], Any]:
    """`destination`, each tensor it returns marked as written in place for autograd (its
    version bumped, as `copy_` does) the moment the library takes its memory: a `backward()`
    that saved its old values raises rather than using the bytes read into it, even when the
    read then fails part-way."""

    def asked(name: str, info: TensorInfo) -> Any:
        target = destination(name, info)
        if target is not None:
            written_in_place((target,))
        return target

    return asked


def stage_with(
    path: Paths,
    device: str,
    convert: Callable[[Any], Any],
    *,
    fast: Optional[Any] = None,
    destination: Optional[Callable[[str, TensorInfo], Any]] = None,
    progress: bool = False,
    rows: Union[None, Mapping[str, RowSpec], Callable[[str, TensorInfo], Optional[RowSpec]]] = None,
    store_options: Optional[Mapping[str, str]] = None,
    **options: Any,
) -> Stage:
    """A `Stage` of `path` on `device` (the library's spelling), each tensor through `fast`
    (`_native._Fast`) where it converts it, else through `convert`."""
    # Every other keyword is a key of the library's options, spelled and parsed there (an
    # unknown one is a TypeError, a bad value an InvalidOptionError).
    if rows is not None and not callable(rows):
        rows = dict(rows)
    if callable(destination):
        destination = _writing_into(destination)
    native = _native._stage(
        paths_of(path),
        destination=destination,
        progress=progress,
        device=device,
        rows=rows,
        store_options=None if store_options is None else dict(store_options),
        **options,
    )
    return Stage(native, convert, fast, one_by_one=destination is not None)


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

    Every keyword in `**options` is a key of the library's options, parsed by the library as the
    `stage` command's `--KEY` flag and C's `stg_config_set(config, "KEY", value)` are: the same
    settings mean the same load in every language.

    Args:
        path: a `.safetensors` file, a directory (its `model.safetensors.index.json`, else its
            `.safetensors` files), an index file, a hub-cache snapshot, a URL, or a list of
            files.
        device: "cpu" (host memory, the `host` backend; the default, as in `safetensors`),
            "cuda", "cuda:N", an int or a `torch.device` (a GPU: backend `auto` picks cuFile,
            then hipFile), "hip:N" (hipFile only), or "auto" (a GPU when one is usable, else
            host memory).
        unsupported_dtypes: "raise" (an `UnsupportedDtypeError` for tensors torch has no
            dtype for, such as F6) or "uint8" (such tensors as `uint8` of their bytes, the last
            dimension widened to bytes).
        process_group: a `torch.distributed` process group, or True for the default group.
            Every rank of it must make the same call and iterate to the end (`load_file`
            does). The checkpoint is read once across the group (each rank about 1/n of the
            bytes, by the library's partition plan) and every piece reaches every rank by
            broadcast; a failure on one rank raises on all, within seconds. `select` and
            `rows` say what this rank keeps; the remote keywords apply too; the report adds
            `bytes_received`. gloo needs device="cpu", NCCL a GPU.
        relay_chunk: with `process_group`, the bytes of one broadcast.
        batch_bytes: with `process_group`, the bytes exchanged between two agreements on
            status.
        **options: the library's options:

            - `backend`: "auto", "host", "cufile", "hipfile".
            - `select`: tensor names or globs to load (`"model.layers.0.*"`; a name without
              glob characters must exist, else `SelectionError`), or a function of a name
              returning whether to load it. Unselected bytes are never read.
            - `rows`: rows of dimension 0 to load, by name or glob: `{"w": (0, 512)}`,
              `{"w": "0:512"}` or `{"w": "1/4"}` (part 1 of 4 near-equal parts, as
              `numpy.array_split`); or a function of `(name, TensorInfo)` returning such a
              range or None.
            - `destination`: a function of `(name, TensorInfo)` returning a contiguous,
              writable tensor (or NumPy array, or any DLPack array) on the load's device, of
              any dtype and shape holding at least `TensorInfo.nbytes`, to read that tensor's
              bytes into; or None to let the library allocate. The library checks device,
              contiguity, writability, dtype and size. The object returned is the one
              yielded; do not touch it until then. Work queued on a CUDA tensor's current
              stream before the callback returned is finished first; work on other streams
              is the caller's to finish. Inside the callback, `report()` (as of the last
              tensor handed out), `backend`, `total_bytes` and `held()` work, `close()` ends
              the load before this tensor is read, and iterating the load raises
              `StagingError`.
            - `memory_cap`: bytes of device memory the load may use (in place of the GPU's
              free memory; for "cpu", the host backend's device buffers). Tensors that do not
              fit take the host path.
            - `map`: on device "cpu" (the default), with no `memory_cap`, tensors from files
              on a local file system (not NFS, SMB, FUSE, ...) are private, copy-on-write
              mappings of the files, as `safetensors` hands out: the page cache is their
              memory and nothing is copied (the report's path is `mapped`).
              `map=False` reads into memory of the library's own; `map=True` maps on the host
              backend whatever the device (`auto` on a machine without a GPU). Writes to a
              mapped tensor stay in this process; a file modified in place while its tensors
              live may show through, and one truncated under them faults when a lost page is
              touched, as with `safetensors` (replace files by renaming over them). NumPy's
              and Flax's arrays are copies unless `map=True` (see the drop-in guide's "How
              tensors relate to the file").
            - `chunk_size`, `staging_size`, `headroom_min`, `headroom_divisor`, `threads`,
              `staging_slots`, `coalesce_below`, `direct_io`, `suballocate`, `cufile_mode`,
              `cufile_lib`, `hipfile_mode`, `hipfile_lib`, `hip_lib`: the staging policy and
              backend options, as the `stage` command's flags.
            - `progress`: a progress bar with GB/s on stderr, when stderr is a terminal.
            - For a URL (`s3://`, `gs://`, `az://`, `http(s)://`, ...; a prefix stands for a
              directory): `concurrency` (ranged GETs in flight, default 16; at least
              min(concurrency, 8) threads read), `range_size` (bytes per GET, default 8 MiB),
              `retries` (of a transient failure, default 5), `bandwidth` (bytes per second),
              `store_options` (object_store options such as
              `{"aws_endpoint": "http://127.0.0.1:9000"}`, applied over the cloud's own
              environment: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`,
              `AWS_REGION`, `AWS_ENDPOINT_URL`, ...),
              `allow_redirect` (a host or list of hosts, `"*.example.com"` or `"*"`, a
              redirect may lead to; the report's `redirects` lists those followed). Secrets
              never appear in an error or dump, nor does the login of an
              `http(s)://user:password@host/` URL (sent to that host as Basic authentication).

    Returns:
        A `Stage` (with `process_group`, an object with the same methods).

    Raises:
        InvalidOptionError: a value the library does not parse (also a `ValueError`).
        TypeError: an unknown keyword.
        BackendUnavailableError: a GPU was asked for and no GPU backend is usable (the message
            says why in a few words, its `details` each backend passed over and why).
        StagingError: a read failed; the exception's subclass and `kind` say how, and its
            message names the tensor, file and offset.
        ModuleNotFoundError: PyTorch is not installed (the message names the fix,
            `pip install torch`, the `[torch]` extra).
    """
    need("torch", "safetensors_staging.stage (and load_file)")
    check_unsupported_dtypes(unsupported_dtypes)
    spelled, gpu = resolve_device(device)
    if process_group is not None:
        return stage_in_group(
            path, spelled, gpu, process_group, unsupported_dtypes, relay_chunk, batch_bytes, options
        )
    return stage_with(
        path,
        spelled,
        lambda staged: to_torch(staged, unsupported_dtypes),
        fast=torch_fast(),
        **options,
    )


def stage_in_group(
    path: Paths,
    device: str,
    gpu: Optional[int],
    group: Any,
    unsupported_dtypes: str,
    relay_chunk: int,
    batch_bytes: int,
    options: Dict[str, Any],
) -> Any:
    """`stage(..., process_group=group)`: see `_distributed.stage_group`."""
    from . import _distributed

    if options.get("destination") is not None:
        raise InvalidOptionError("destination= is not supported with process_group= yet")
    options.pop("destination", None)
    selection = {"select": options.pop("select", None), "rows": options.pop("rows", None)}
    if selection["rows"] is not None and not callable(selection["rows"]):
        selection["rows"] = dict(selection["rows"])
    paths = paths_of(path)
    # The library says what this rank keeps, given the load's own keywords (the remote ones
    # too); `progress` is this door's alone.
    asked = {key: value for key, value in options.items() if key != "progress"}
    if asked.get("store_options") is not None:
        asked["store_options"] = dict(asked["store_options"])

    def open_kept() -> Tuple[Checkpoint, List[TensorInfo]]:
        return _native._select(paths, device=device, **selection, **asked)

    def open_own(select: Callable[[str], bool], rows: Callable[[str, TensorInfo], Any]) -> Stage:
        return stage_with(paths, device, lambda staged: staged, select=select, rows=rows, **options)

    def to_torch(buffer: Any, dtype: str, shape: List[int], name: str) -> Any:
        return torch_from_bytes(buffer, dtype, shape, unsupported_dtypes, name)

    def check(dtype: str, shape: List[int], name: str) -> None:
        # Before any exchange: a tensor this rank could not hand over fails every rank now,
        # not this one alone in the middle of the exchange.
        torch_view(dtype, shape, unsupported_dtypes, name)

    return _distributed.stage_group(
        gpu, group, open_kept, open_own, to_torch, check, relay_chunk, batch_bytes
    )


def load_file(path: Paths, device: Any = "cpu", **options: Any) -> Dict[str, torch.Tensor]:
    """Loads a checkpoint into `{name: torch.Tensor}`, like `safetensors.torch.load_file`.

    Args:
        path: what `stage` takes.
        device: what `stage` takes ("cpu" by default).
        **options: every keyword of `stage`.

    Returns:
        Every selected tensor by name, each on `device`. Where `device` is a GPU, a tensor
        its memory cannot hold is an `OutOfMemoryError` (also a `torch.OutOfMemoryError`), as
        `safetensors` raises torch's, not a CPU tensor: `host_assembly=True` asks for `stage`'s
        policy instead (such a tensor assembled in host memory and handed out on the CPU;
        `stage(...).report()["fallbacks"]` counts them).

    Raises:
        OutOfMemoryError: device memory ran short (a GPU, without `host_assembly=True`).
        StagingError: as `stage` raises.
    """
    gpu = on_the_device(device, options)
    with torch_out_of_memory(gpu), stage(path, device, **options) as tensors:
        if isinstance(tensors, Stage):
            return tensors.all()
        return dict(tensors)  # a process group's


def open(path: Paths, **remote: Any) -> Checkpoint:
    """A checkpoint's metadata, with nothing loaded.

    Args:
        path: what `stage` takes.
        **remote: for a URL, `stage`'s remote keywords (`concurrency`, `range_size`,
            `retries`, `bandwidth`, `store_options`).

    Returns:
        A `Checkpoint`: `keys()`, `ckpt[name]` (a `TensorInfo`: dtype, shape, nbytes, file,
        offset), `metadata()` (`__metadata__`), `files`, `total_bytes`. A context manager,
        like `safetensors.safe_open`.

    Raises:
        StagingError: the checkpoint cannot be read (its subclass says why).
    """
    if "store_options" in remote and remote["store_options"] is not None:
        remote["store_options"] = dict(remote["store_options"])
    return _native._open(paths_of(path), **remote)


def describe_options(**options: Any) -> str:
    """The library's load options these keywords give, as `stage --print-options` and C's
    `stg_config_describe` print them for the same settings.

    Args:
        **options: `stage`'s option keywords (`device`, `backend`, `memory_cap`, `select`,
            `rows`, `store_options`, ...), taken and checked as a load takes them; None keeps
            a default.

    Returns:
        One `key = value` line per key, in the order of the options table (a repeatable key,
        such as `select`, has a line per value), each ending in a newline; values are
        spelled as the `stage` flags and `stg_config_set` take them, so the lines set again
        give the same options. A key left at its default says so: `chunk_size = 16MiB  #
        default`, or, where the default is a description rather than a value, a comment line
        `# memory_cap = none (default)`. A secret is shown as `<redacted>`. Note that
        `stage` and `load_file` default to `device="cpu"` where the library (and so this
        description, with no `device`) says `auto`.

    Raises:
        InvalidOptionError: a value the library does not parse (also a `ValueError`).
        TypeError: an unknown keyword.

    Example:
        ```python
        print(st.describe_options(device="cuda:0", memory_cap="8GiB"), end="")
        ```
    """
    if options.get("store_options") is not None:
        options["store_options"] = dict(options["store_options"])
    if options.get("rows") is not None and not callable(options["rows"]):
        options["rows"] = dict(options["rows"])
    return _native._options(**options)
