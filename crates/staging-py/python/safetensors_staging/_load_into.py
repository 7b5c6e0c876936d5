"""`load_into`: a checkpoint read into the tensors that already hold a model's weights.

Every header is read and every name, shape and dtype checked against the target before the
first byte moves; then each tensor goes through the library's destination path straight into
the memory of the tensor it replaces (no second copy of the model). A failure after writing
began says exactly which tensors hold new bytes, which may hold some, and which hold old ones.
"""

from __future__ import annotations

import fnmatch
import json
import os
from typing import (
    TYPE_CHECKING,
    Any,
    Dict,
    Iterable,
    List,
    Mapping,
    NamedTuple,
    Optional,
    Set,
    Tuple,
)

from . import _native
from ._convert import written_in_place
from ._device import resolve_device
from ._dtypes import torch_view
from ._engines import is_hub as _is_hub
from ._load import Paths, paths_of
from ._native import SelectionError, StagingError, TensorInfo

if TYPE_CHECKING:
    import torch

__all__ = ["LoadIntoError", "LoadIntoResult", "MismatchError", "PartialLoadError", "load_into"]


class MismatchError(SelectionError):
    """The checkpoint does not fit the target (a missing or unexpected tensor with `strict`, a
    shape, a dtype, memory that cannot be written in place): raised before any byte is
    written, so the target is unchanged.

    Attributes:
        problems: one line per tensor that does not fit.
    """

    kind = "selection"

    def __init__(self, message: str, problems: Optional[List[str]] = None) -> None:
        super().__init__(message)
        self.problems = list(problems or [])


def _mismatch(problems: List[str]) -> MismatchError:
    shown = "; ".join(problems[:8])
    more = f"; and {len(problems) - 8} more" if len(problems) > 8 else ""
    return MismatchError(
        f"the checkpoint does not fit the target, nothing was written: {shown}{more}", problems
    )


class PartialLoadError(StagingError):
    """A load into the target failed after writing began (a read error, an interrupt). The
    cause is `__cause__` (its `kind` is this error's); what each tensor of the target holds is
    listed.

    Attributes:
        written: names of the tensors that hold the checkpoint's bytes, whole.
        partly_written: names of the tensors whose writing had begun and not ended: some of
            their bytes may be new, some old. Reload them (or the whole model).
        unchanged: names of the tensors never written: their old bytes.
    """

    kind = "read"

    def __init__(
        self,
        message: str,
        written: Optional[List[str]] = None,
        partly_written: Optional[List[str]] = None,
        unchanged: Optional[List[str]] = None,
    ) -> None:
        super().__init__(message)
        self.written = list(written or [])
        self.partly_written = list(partly_written or [])
        self.unchanged = list(unchanged or [])


class LoadIntoError(PartialLoadError, KeyboardInterrupt):
    """A `PartialLoadError` caused by Ctrl-C: still a `KeyboardInterrupt`."""

    kind = "read"


def _partial(
    cause: BaseException, written: List[str], partly: List[str], unchanged: List[str]
) -> PartialLoadError:
    error_type = LoadIntoError if isinstance(cause, KeyboardInterrupt) else PartialLoadError
    error = error_type(
        f"the load into the target failed after writing began ({type(cause).__name__}: "
        f"{cause}); {len(written)} tensors hold the checkpoint's bytes, "
        f"{len(partly)} may hold some of them ({_names(partly)}), "
        f"{len(unchanged)} are unchanged",
        written,
        partly,
        unchanged,
    )
    kind = getattr(cause, "kind", None)
    if isinstance(kind, str):
        error.kind = kind
    return error


def _names(names: List[str]) -> str:
    shown = ", ".join(names[:4])
    return shown + (f", ... ({len(names) - 4} more)" if len(names) > 4 else "") if names else "none"


class LoadIntoResult(NamedTuple):
    """What `load_into` did: `missing_keys` and `unexpected_keys` as `load_state_dict`
    returns them, and the load's report (`stage --json`'s keys)."""

    missing_keys: List[str]
    unexpected_keys: List[str]
    report: Dict[str, Any]


def _targets(target: Any) -> Dict[str, torch.Tensor]:
    """The target's tensors by name: a module's `state_dict()` (parameters and persistent
    buffers, sharing their memory), or a mapping of names to tensors."""
    import torch

    if isinstance(target, torch.nn.Module):
        tensors = target.state_dict()
    elif isinstance(target, Mapping):
        tensors = dict(target)
    else:
        raise TypeError(
            f"load_into takes a torch.nn.Module or a mapping of names to tensors, not "
            f"{type(target).__name__}"
        )
    for name, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"target tensor {name!r} is a {type(tensor).__name__}, not a tensor")
    return {name: tensor.detach() for name, tensor in tensors.items()}


def _tied_groups(tensors: Mapping[str, torch.Tensor]) -> List[List[str]]:
    """Names that are one tensor (tied weights: the same memory, shape, strides and dtype),
    each group in the target's order."""
    groups: Dict[Tuple[Any, ...], List[str]] = {}
    for name, tensor in tensors.items():
        key = (
            tensor.device,
            tensor.data_ptr(),
            tensor.dtype,
            tuple(tensor.shape),
            tuple(tensor.stride()),
        )
        if tensor.numel() == 0:
            key = (name,)  # empty tensors share no bytes, whatever their pointer says
        groups.setdefault(key, []).append(name)
    return list(groups.values())


def _matches(name: str, only: Optional[List[str]]) -> bool:
    return only is None or any(fnmatch.fnmatchcase(name, pattern) for pattern in only)


def _problem(name: str, info: TensorInfo, tensor: torch.Tensor) -> Optional[str]:
    """Why `tensor` cannot take `info`'s bytes in place; None when it can."""
    import torch

    dtype, shape = torch_view(info.dtype, list(info.shape), "uint8", name)
    if dtype is None:  # no torch dtype of its own: the bytes, as `uint8`
        dtype = torch.uint8
    if list(tensor.shape) != list(shape):
        return (
            f"{name}: shape {list(info.shape)} in the checkpoint, {list(tensor.shape)} in the "
            "target"
        )
    if tensor.dtype != dtype:
        return f"{name}: dtype {info.dtype} in the checkpoint, {tensor.dtype} in the target"
    if not tensor.is_contiguous():
        return f"{name}: not contiguous in the target (its bytes cannot be written in place)"
    return None


def _overlaps(tensors: Mapping[str, torch.Tensor]) -> List[str]:
    """Targets whose memory overlaps another's without being the same tensor (a fused
    `qkv` and a view of its `q` rows): written in place, one would overwrite the other."""
    spans = sorted(
        (str(t.device), t.data_ptr(), t.data_ptr() + t.numel() * t.element_size(), name)
        for name, t in tensors.items()
        if t.numel()
    )
    problems = []
    for (device, _, end, name), (next_device, start, _, other) in zip(spans, spans[1:]):
        if device == next_device and start < end:
            problems.append(
                f"{name}: its memory overlaps {other}'s in the target (written in place, one "
                "would overwrite the other)"
            )
    return problems


def _device_of(tensor: torch.Tensor) -> str:
    if tensor.device.type == "cpu":
        return "cpu"
    if tensor.device.type == "cuda":
        return f"cuda:{tensor.device.index or 0}"
    raise _mismatch([f"{tensor.device}: the library does not load to this device"])


def _held_already(
    loading: Mapping[str, TensorInfo],
    changes: Mapping[str, Any],
    group_of: Mapping[str, List[str]],
    wanted: Set[str],
    load: Mapping[str, Any],
) -> Tuple[Set[str], Optional[str]]:
    """The names of `loading` (each tied group's writer) whose bytes a target that holds the
    revision `since` holds already: the same name wrote its group at `since`, from the same
    file, whose bytes did not change. And a note on how that was found (`None` when the Hub's
    listings were compared and `since`'s headers read).

    Files are compared by their paths in the repository (the native side's, never URL text);
    which name wrote each group at `since` comes from `since`'s headers (a tied copy added,
    removed or moved to another file changes the writer, and a tensor moved between files
    changes where its bytes come from): where they cannot be read, every group is written."""
    changed = set(changes["changed"])
    commit, since = changes["commit"], changes["since"]
    here = {
        name: _native._hub_repository_path(str(info.file), commit) for name, info in loading.items()
    }
    candidates = {name for name, path in here.items() if path is not None and path not in changed}
    note: Optional[str] = changes.get("note")
    if not candidates:
        return set(), note
    try:
        _, before = _native._select(
            paths_of(changes["since_path"]), select=lambda name: name in wanted, **load
        )
    except StagingError as error:
        why = f"{since}'s headers could not be read ({error}): every tensor written"
        return set(), why if note is None else f"{note}; {why}"
    was = {info.name: _native._hub_repository_path(str(info.file), since) for info in before}
    held = set()
    for name in candidates:
        if changes["compared"] == "cache" and len(group_of[name]) > 1:
            # From the cache, `since`'s snapshot may lack a file of a tied copy (a load that
            # read another copy did not cache it), and a folder's headers do not say so: the
            # writer at `since` is not known, and the group is written.
            continue
        writer = [n for n in group_of[name] if n in was][-1:]
        if writer == [name] and was[name] == here[name]:
            held.add(name)
    return held, note


def load_into(
    target: Any,
    source: Paths,
    *,
    strict: bool = True,
    only: Optional[Iterable[str]] = None,
    rows: Any = None,
    since: Optional[str] = None,
    **options: Any,
) -> LoadIntoResult:
    """Reads a checkpoint into the tensors of `target`, in place: every parameter keeps its
    memory (`data_ptr`), and no second copy of the model is ever held.

    Before the first byte is written, every header is read and every tensor of the checkpoint
    that the target has is checked: the same shape, the same dtype, contiguous memory. Then
    each is read through the library's destination path straight into the target's memory (on
    a GPU through cuFile, or a pinned buffer, into the parameter itself; on the CPU a read into
    the parameter's memory).

    Args:
        target: a `torch.nn.Module` (its `state_dict()` names: parameters and persistent
            buffers) or a mapping of names to tensors. Tied weights (names sharing one
            tensor's memory) are written once, from the last of their names (in the target's
            order) that the checkpoint has: the bytes `load_state_dict` would leave there.
            Every tensor written has its autograd version bumped, as an in-place `copy_`
            does, so a `backward()` pending on the old weights raises rather than using the
            new ones.
        source: anything `stage` reads: a file, a directory, an index, a hub-cache snapshot,
            a URL, a list of files.
        strict: as `load_state_dict`'s: a tensor of the target the checkpoint lacks, or one of
            the checkpoint the target lacks, is a `MismatchError` (nothing written). With
            `strict=False` they are returned in `missing_keys` and `unexpected_keys`.
        only: names or globs (`"model.layers.0.*"`): only the tensors matching them, in the
            target and in the checkpoint, are considered.
        rows: rows of dimension 0 of the checkpoint's tensors, as `stage`'s `rows`
            (`{"*.q_proj.weight": "1/4"}`): a tensor-parallel rank's parameter holding its
            rows of the checkpoint's tensor.
        since: for a model on the Hugging Face Hub (`source` an `hf://` path), the revision
            the target holds now (a commit, branch or tag): only the tensors of the files
            that differ between it and `source`'s revision are read and written, the others
            left as they are (each file's blob compared). The source is read at the commit
            its revision names when this is called; the report's `since` says which commits,
            the files changed and the tensors left (`unchanged`).
        **options: `stage`'s options (`backend`, `threads`, the remote keywords, ...); not
            `device`, `select` or `destination`, which the target decides.

    Returns:
        A `LoadIntoResult`: `missing_keys`, `unexpected_keys`, `report`.

    Raises:
        MismatchError: before anything is written: a shape, a dtype, non-contiguous memory,
            or (with `strict`) a missing or unexpected tensor; its `problems` list each.
        PartialLoadError: writing began and failed; its `written`, `partly_written` and
            `unchanged` say what each tensor holds (`LoadIntoError`, also a
            `KeyboardInterrupt`, when Ctrl-C ended it).
        StagingError: the checkpoint's headers cannot be read (nothing written).
        TypeError: a target that is not a module or a mapping of tensors; an option the
            target decides.
    """
    for key in ("device", "select", "destination"):
        if key in options:
            raise TypeError(f"load_into takes no {key}=: the target's tensors decide it")
    patterns = None if only is None else ([only] if isinstance(only, str) else list(only))
    changes: Optional[Dict[str, Any]] = None
    if since is not None:
        changes = _changes(source, since, options)
        source = changes["path"]  # the commit the changes were found at
    tensors = _targets(target)
    group_of = {name: group for group in _tied_groups(tensors) for name in group}
    wanted = {name for name in tensors if _matches(name, patterns)}
    # The keywords of every library call of this load (`options` holds the remote ones).
    load = {"rows": rows, "store_options": options.pop("store_options", None), **options}
    checkpoint, kept = _native._select(paths_of(source), select=lambda name: name in wanted, **load)
    in_checkpoint = [name for name in checkpoint.keys() if _matches(name, patterns)]
    present = set(in_checkpoint)
    writer = _writers(kept, group_of)
    loading = {info.name: info for info in kept if writer[info.name] == info.name}
    left: List[str] = []
    since_note: Optional[str] = None
    if changes is not None:
        same, since_note = _held_already(loading, changes, group_of, wanted, load)
        left = [info.name for info in kept if writer[info.name] in same]
        loading = {name: info for name, info in loading.items() if name not in same}
    missing = [
        name
        for name in tensors
        if name in wanted and name not in present and not any(n in present for n in group_of[name])
    ]
    unexpected = [name for name in in_checkpoint if name not in tensors]
    problems = []
    if strict:
        problems += [f"{name}: missing from the checkpoint" for name in missing]
        problems += [f"{name}: in the checkpoint, not in the target" for name in unexpected]
    by_device = _by_device(tensors, loading, problems)
    reports = _write(paths_of(source), by_device, tensors, loading, group_of, left, load)
    merged = _merged(reports) if reports else {"tensors": 0, "bytes": 0, "bytes_read": 0}
    if changes is not None:
        merged["since"] = _since_report(changes, left, since_note)
    return LoadIntoResult(missing, unexpected, merged)


def _changes(source: Paths, since: str, options: Mapping[str, Any]) -> Dict[str, Any]:
    """What changed on the Hub between the revision `since` and `source`'s (`since=`)."""
    if not isinstance(source, (str, os.PathLike)) or not _is_hub(os.fspath(source)):
        raise TypeError(
            f"since={since!r} names a revision of a model on the Hub: the source must be "
            f"an hf:// path, not {source!r}"
        )
    return _native._hub_changes(
        os.fspath(source),
        since,
        store_options=options.get("store_options"),
        **{k: v for k, v in options.items() if k != "store_options"},
    )


def _writers(kept: List[TensorInfo], group_of: Mapping[str, List[str]]) -> Dict[str, str]:
    """Each kept name -> the name its tied group is loaded from.

    One name per tied group is loaded: the last, in the target's order, that the checkpoint
    has. `load_state_dict` copies every name in that order into the one tensor, so the last
    one's bytes are what it leaves (the copies of a checkpoint may differ). Chosen over the
    whole checkpoint, with `since=` too: a group is then left alone only where its writer's
    bytes are the ones the target holds."""
    kept_names = {info.name for info in kept}
    chosen = {id(group): [n for n in group if n in kept_names][-1:] for group in group_of.values()}
    return {info.name: chosen[id(group_of[info.name])][0] for info in kept}


def _by_device(
    tensors: Mapping[str, torch.Tensor], loading: Mapping[str, TensorInfo], problems: List[str]
) -> Dict[str, List[str]]:
    """The names of `loading` by the device of their target, each checked (shape, dtype,
    contiguous memory, no overlap); a `MismatchError` listing `problems` and those found,
    before any byte is written, if there are any."""
    by_device: Dict[str, List[str]] = {}
    for name, info in loading.items():
        tensor = tensors[name]
        problem = _problem(name, info, tensor)
        if problem is not None:
            problems.append(problem)
            continue
        by_device.setdefault(_device_of(tensor), []).append(name)
    problems += _overlaps({name: tensors[name] for name in loading})
    if problems:
        raise _mismatch(problems)
    return by_device


def _write(
    paths: List[str],
    by_device: Mapping[str, List[str]],
    tensors: Mapping[str, torch.Tensor],
    loading: Mapping[str, TensorInfo],
    group_of: Mapping[str, List[str]],
    left: List[str],
    load: Mapping[str, Any],
) -> List[Dict[str, Any]]:
    """Writes the checked tensors of `loading` into their targets; the reports of the loads.

    In one call of the library per device (no Python between two tensors): each target's
    memory by address, with what the checkpoint's tensor was checked to be, checked again by
    the library as the load reaches it. A failure once something was written is a
    `PartialLoadError` (`left`, the tensors `since=` left alone, among its `unchanged`)."""
    written: List[str] = []
    reports: List[Dict[str, Any]] = []
    for device, names in by_device.items():
        spelled, gpu = resolve_device(device)
        if gpu is not None:
            import torch

            # The library writes the parameters by address, outside torch's streams: work
            # queued on them (a forward pass reading them) ends first.
            torch.cuda.synchronize(gpu)
        targets = [
            (
                name,
                tensors[name].data_ptr(),
                loading[name].nbytes,
                loading[name].dtype,
                list(loading[name].shape),
            )
            for name in names
        ]
        try:
            done, report = _native._load_into(paths, targets, device=spelled, **load)
        except BaseException as cause:
            now = list(getattr(cause, "written", []))
            partly = list(getattr(cause, "partly_written", []))
            cause = _bumped_after(cause, now + partly, tensors, group_of)
            if not written and not now and not partly:
                raise  # nothing was written: the target is as it was
            done_names = set(written) | set(now)
            unchanged = [n for n in loading if n not in done_names and n not in set(partly)]
            unchanged += left  # left alone by `since=`: their bytes are the revision's
            raise _partial(cause, written + now, partly, unchanged) from cause
        # Every tensor over the memory written, each its own autograd version (a buffer
        # registered as a parameter's `.data` has one apart), as `load_state_dict` bumps each.
        written_in_place(tensors[n] for name in done for n in group_of[name])
        written += done
        reports.append(json.loads(report))
    return reports


def _bumped_after(
    cause: BaseException,
    names: List[str],
    tensors: Mapping[str, torch.Tensor],
    group_of: Mapping[str, List[str]],
) -> BaseException:
    """After a failed write, the tensors whose writing began (`names` and their tied copies)
    have their autograd versions bumped; returns what caused the failure: `cause`, or a
    Ctrl-C whose Python handler ran only now."""
    for _ in range(3):
        try:
            written_in_place(tensors[n] for name in names for n in group_of[name])
            break
        except KeyboardInterrupt as late:
            # A Ctrl-C whose Python handler runs only now (it stopped the load from
            # Rust first): what it stopped is still said, the Ctrl-C the cause.
            if not isinstance(cause, KeyboardInterrupt):
                late.__context__ = cause
                cause = late
        except Exception:  # never in place of what says which tensors hold what
            break
    return cause


def _since_report(changes: Mapping[str, Any], left: List[str], note: Optional[str]) -> Any:
    """The report's `since`: the commits compared, the files changed, the tensors left."""
    return {
        "commit": changes["commit"],
        "since": changes["since"],
        "changed": changes["changed"],
        "unchanged": left,
        "compared": changes["compared"],
        "note": note,
    }


def _merged(reports: List[Dict[str, Any]]) -> Dict[str, Any]:
    """One report of the loads of several devices (the one report, when there was one)."""
    if len(reports) == 1:
        return reports[0]
    merged: Dict[str, Any] = {
        key: sum(int(r.get(key, 0)) for r in reports)
        for key in ("tensors", "bytes", "bytes_read", "read_requests")
    }
    merged["paths"] = {
        path: {
            count: sum(int(r.get("paths", {}).get(path, {}).get(count, 0)) for r in reports)
            for count in ("tensors", "bytes")
        }
        for path in ("destination", "device", "host", "mapped")
    }
    merged["loads"] = reports
    return merged
