"""Loading across a `torch.distributed` group: every byte read once, shared by broadcast.

Every rank computes the same partition plan (the Rust library's `Plan`: the tensors laid end to
end, cut into equal shares, a tensor straddling a cut split by rows) and loads only its own
pieces, with the ordinary loader, onto its device. Then all ranks walk the plan's pieces in the
same order and each piece is broadcast from its owner, as `uint8` bytes (so no dtype depends on
what the collective backend supports), in chunks of at most `relay_chunk` bytes; runs of small
pieces of one owner travel packed together, one broadcast for many tensors (a checkpoint of
thousands of small tensors would otherwise pay one collective's latency for each). A rank keeps
the tensors (and rows) its `select`/`rows` ask for, as the library selects them for a load without
a group (`_native._select`); the bytes of the others still pass through it, into one scratch
buffer of at most `relay_chunk` bytes, which also packs the runs of small pieces it sends.

Every step that can fail is inside an agreement: the ranks agree on status with one `all_reduce`
after the plan, after opening their own loads (and the one scratch buffer), after preparing each
batch (its own pieces loaded, the receive buffers of the tensors it starts allocated) and after
exchanging it. Between the last two, a rank does nothing but broadcasts and copies into memory
it already holds; if a copy fails there (or the view of a finished tensor), it keeps taking part
in every broadcast of the batch and reports the failure at the batch's end. So the kept tensors
a batch starts are allocated at its start, and handed out only at its end, once agreed.

If any rank failed (a malformed shard, a read error, a bad selection, out of memory), the first
failing rank broadcasts its error and every rank raises the same `StagingError` subclass, with
"rank R: " in front and the same `kind` (an allocation that failed is an `OutOfMemoryError`;
anything else not of this package a `StagingError`). No rank waits on a broadcast from a rank
that has failed, and none goes on with a partial model. A rank that dies outright is caught by
the group's own timeout.

A failed load leaves nothing of the group behind: the exception raised carries no frames of the
exchange (see `_without_frames`), so the caller's `destroy_process_group()` really destroys the
group, and the group can load again meanwhile.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from . import _native
from ._device import torch_device
from ._native import InvalidOptionError, OutOfMemoryError, StagingError

_MESSAGE_BYTES = 4096


class _Agreement:
    """One collective per check: all ranks learn whether any failed, and the first failure."""

    def __init__(self, dist: Any, torch: Any, group: Any, device: Any) -> None:
        self.dist, self.torch, self.group, self.device = dist, torch, group, device
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)

    def __call__(self, error: Optional[BaseException]) -> None:
        torch, dist = self.torch, self.dist
        flag = torch.tensor(
            [self.world - self.rank if error is not None else 0],
            dtype=torch.int64,
            device=self.device,
        )
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        worst = int(flag.item())
        if worst == 0:
            return
        failing = self.world - worst
        message = torch.zeros(_MESSAGE_BYTES, dtype=torch.uint8, device=self.device)
        if self.rank == failing:
            assert error is not None
            cls, kind = self._classified(error)
            text = f"{cls.__name__}\n{kind}\n{error}".encode()[: _MESSAGE_BYTES - 1]
            message[: len(text)] = torch.frombuffer(bytearray(text), dtype=torch.uint8)
        dist.broadcast(message, src=dist.get_global_rank(self.group, failing), group=self.group)
        # Every rank has the message before any raises (and perhaps tears the group down).
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        raw = bytes(message.cpu().numpy().tobytes()).rstrip(b"\0").decode(errors="replace")
        name, _, rest = raw.partition("\n")
        kind, _, text = rest.partition("\n")
        cls = getattr(_native, name, StagingError)
        if not (isinstance(cls, type) and issubclass(cls, StagingError)):
            cls = StagingError
        raised = cls(f"rank {failing}: {text}")
        raised.kind = kind or cls.kind
        if self.rank == failing:
            raise raised from error
        raise raised

    def _classified(self, error: BaseException) -> Tuple[type, str]:
        """The class and kind every rank raises for this rank's `error`."""
        if isinstance(error, StagingError):
            return type(error), error.kind
        if isinstance(error, (MemoryError, getattr(self.torch, "OutOfMemoryError", ()))):
            return (
                OutOfMemoryError,
                "host-allocation" if self.device.type == "cpu" else "device-allocation",
            )
        return StagingError, StagingError.kind


class _FirstFailure:
    """This rank's first failure in its own steps of an exchange (a copy, a view): its later own
    steps are skipped, its broadcasts are not, and the batch's agreement reports it."""

    def __init__(self) -> None:
        self.error: Optional[BaseException] = None

    def run(self, step: Callable[..., Any], *args: Any) -> Any:
        if self.error is None:
            try:
                return step(*args)
            except Exception as e:  # noqa: BLE001 - every rank must learn of it
                self.error = e
        return None


def _without_frames(error: BaseException) -> BaseException:
    """`error`, with the tracebacks of it, its cause and its context dropped.

    Those tracebacks hold the exchange's frames, and with them the process group and the tensors
    its collectives used, in a reference cycle (an exception kept in a local of a frame in its
    own traceback) that only the garbage collector breaks: perhaps at interpreter exit, after
    `destroy_process_group()` could not destroy the group. Gloo's worker thread then drops its
    last reference to such a tensor while the interpreter finalizes, needs the GIL for it, and
    the process aborts ("terminate called without an active exception", backtrace through
    `ProcessGroupGloo::runLoop` and `TensorImpl::decref_pyobject`; seen here about once in 10
    runs of a failing 2-rank load). Dropped, they are freed at once. The message names the rank,
    tensor, file and offset; the re-raised exception's traceback starts at the caller's call.
    """
    seen = set()
    pending: List[Optional[BaseException]] = [error]
    while pending:
        e = pending.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        e.__traceback__ = None
        pending += [e.__cause__, e.__context__]
    return error


class GroupStage:
    """A load across a process group: an iterator of `(name, tensor)`.

    The tensors this rank keeps, in file order. Every rank must iterate it to the end (as
    `load_file` does): the exchange is collective. It has the methods of `Stage`.
    """

    def __init__(self, generator: Iterator[Tuple[str, Any]], state: Dict[str, Any]) -> None:
        self._generator = generator
        self._state = state

    def __iter__(self) -> GroupStage:
        return self

    def __next__(self) -> Tuple[str, Any]:
        try:
            return next(self._generator)
        except StopIteration:
            raise
        except BaseException as error:
            self.close()
            # `error` is cleared when this block ends, so no frame here keeps it either. Not
            # `from`: the error is re-raised as it is, its own cause kept.
            raise _without_frames(error)  # noqa: B904

    def __enter__(self) -> GroupStage:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Ends the load; tensors already handed out stay valid."""
        self._generator.close()
        own = self._state.get("own")
        if own is not None:
            own.close()

    def report(self) -> Dict[str, Any]:
        """This rank's own load's report (as `Stage.report`) plus `rank`, `world`,
        `bytes_received`, `pieces_owned` and `plan_fingerprint`."""
        own = self._state.get("own")
        report = own.report() if own is not None else {}
        report.update(
            rank=self._state["rank"],
            world=self._state["world"],
            bytes_received=self._state["bytes_received"],
            pieces_owned=self._state["pieces_owned"],
            plan_fingerprint=self._state["fingerprint"],
        )
        return report

    def held(self) -> Dict[str, int]:
        """Bytes this rank's own load holds now, as `Stage.held`."""
        own = self._state.get("own")
        return own.held() if own is not None else {"device": 0, "host": 0, "caller": 0}


def stage_group(
    gpu: Optional[int],
    group: Any,
    open_kept: Callable[[], Tuple[Any, List[Any]]],
    open_own: Callable[..., Any],
    to_torch: Callable[[Any, str, List[int], str], Any],
    check: Callable[[str, List[int], str], None],
    relay_chunk: int,
    batch_bytes: int,
) -> GroupStage:
    """`open_kept()` gives the checkpoint and the tensors this rank keeps (the library's
    `_select`); `open_own(select, rows)` opens this rank's load of its own pieces."""
    import torch
    import torch.distributed as dist

    if group is None or group is True:
        group = dist.group.WORLD
    device = torch_device(gpu)
    if dist.get_backend(group) == "nccl" and gpu is None:
        raise InvalidOptionError('an NCCL process group moves CUDA tensors: pass device="cuda:N"')
    if relay_chunk <= 0 or batch_bytes <= 0:
        raise InvalidOptionError("relay_chunk and batch_bytes must be positive")
    agree = _Agreement(dist, torch, group, device)
    state: Dict[str, Any] = {
        "rank": agree.rank,
        "world": agree.world,
        "bytes_received": 0,
        "pieces_owned": 0,
        "fingerprint": None,
        "own": None,
    }
    exchange = _Exchange(
        torch=torch,
        dist=dist,
        group=group,
        agree=agree,
        device=device,
        state=state,
        open_kept=open_kept,
        open_own=open_own,
        to_torch=to_torch,
        check=check,
        relay_chunk=relay_chunk,
        batch_bytes=batch_bytes,
    )
    generator = exchange.run()
    return GroupStage(generator, state)


def _keep(infos: Dict[str, Any], selected: List[Any]) -> Dict[str, Tuple[int, int, List[int]]]:
    """What this rank keeps, as the library selected it: name -> (first byte, end byte, shape
    kept), bytes counted from the tensor's first."""
    kept: Dict[str, Tuple[int, int, List[int]]] = {}
    for info in selected:
        first = info.offset - infos[info.name].offset
        kept[info.name] = (first, first + info.nbytes, list(info.shape))
    return kept


Piece = Tuple[str, int, int, int, Any]


def _batches(pieces: List[Piece], batch_bytes: int) -> List[List[Piece]]:
    """The plan's pieces in batches of about `batch_bytes` (at most 512 pieces), in order."""
    batches: List[List[Piece]] = []
    batch: List[Piece] = []
    size = 0
    for p in pieces:
        batch.append(p)
        size += p[2]
        if size >= batch_bytes or len(batch) >= 512:
            batches.append(batch)
            batch, size = [], 0
    if batch:
        batches.append(batch)
    return batches


@dataclass
class _Exchange:
    """One rank's part of a load across the group (see the module's doc): the group, its
    agreement and the load's callables, given; what the plan says this rank keeps, and the
    memory the exchange holds, found as it runs (`run`, a generator of the kept tensors)."""

    torch: Any
    dist: Any
    group: Any
    agree: _Agreement
    device: Any
    # The report's counts (`GroupStage`'s state), kept up to date; `own` this rank's load.
    state: Dict[str, Any]
    open_kept: Callable[[], Tuple[Any, List[Any]]]
    open_own: Callable[..., Any]
    to_torch: Callable[[Any, str, List[int], str], Any]
    check: Callable[[str, List[int], str], None]
    relay_chunk: int
    batch_bytes: int
    # The checkpoint (held while the exchange runs), its tensors by name, and what this rank
    # keeps of them (`_keep`).
    checkpoint: Any = None
    infos: Dict[str, Any] = field(default_factory=dict)
    kept: Dict[str, Tuple[int, int, List[int]]] = field(default_factory=dict)
    # The kept tensors begun and not yet handed out: name -> the memory of their kept bytes.
    buffers: Dict[str, Any] = field(default_factory=dict)
    # What passes through this rank without being kept, and a run of small pieces packed for
    # one broadcast, go through this one buffer, allocated before the exchange.
    scratch: Any = None

    def run(self) -> Iterator[Tuple[str, Any]]:
        pieces = self._plan()
        mine = [p for p in pieces if p[3] == self.agree.rank]
        self.state["pieces_owned"] = len(mine)
        batches = _batches(pieces, self.batch_bytes)
        units = [_units(batch, self.relay_chunk) for batch in batches]
        own = self._open(mine, batches, units)
        pieces_left = Counter(p[0] for p in pieces)
        for batch, batch_units in zip(batches, units):
            loaded = self._prepare(batch, own)
            # Exchanged: broadcasts, and copies into the memory prepared above.
            local = _FirstFailure()
            finished: List[Tuple[str, Any]] = []
            for unit in batch_units:
                if len(unit) > 1:
                    self._send_packed(batch, unit, loaded, local)
                else:
                    self._send_alone(batch, unit[0], loaded, local)
                for i in unit:
                    name = batch[i][0]
                    loaded.pop(i, None)
                    pieces_left[name] -= 1
                    keep = self.kept.get(name)
                    if pieces_left[name] == 0 and keep is not None:
                        buffer = self.buffers.pop(name)
                        dtype = self.infos[name].dtype
                        tensor = local.run(self.to_torch, buffer, dtype, keep[2], name)
                        finished.append((name, tensor))
            self.agree(local.error)
            yield from finished
        # Every rank's own load ended with its last piece; let it say so (and free its buffers),
        # and agree once more, so that no rank returns while another still waits on it.
        error = None
        try:
            for _ in own:
                pass
        except Exception as e:  # noqa: BLE001
            error = e
        self.agree(error)

    def _plan(self) -> List[Piece]:
        """The plan's pieces, once every rank has planned the same and can hand over what it
        keeps."""
        torch, dist, agree = self.torch, self.dist, self.agree
        error: Optional[BaseException] = None
        try:
            self.checkpoint, selected = self.open_kept()
            fingerprint, pieces = self.checkpoint.plan(agree.world)
            self.infos = {info.name: info for info in self.checkpoint.tensors()}
            self.kept = _keep(self.infos, selected)
            for name, (_, _, shape) in self.kept.items():
                self.check(self.infos[name].dtype, shape, name)
        except Exception as e:  # noqa: BLE001 - every rank must learn of it
            error = e
        agree(error)
        self.state["fingerprint"] = fingerprint
        # The same plan everywhere: the lowest and highest fingerprint agree.
        signed = fingerprint - (1 << 64) if fingerprint >= 1 << 63 else fingerprint
        low = torch.tensor([signed], dtype=torch.int64, device=self.device)
        high = low.clone()
        dist.all_reduce(low, op=dist.ReduceOp.MIN, group=self.group)
        dist.all_reduce(high, op=dist.ReduceOp.MAX, group=self.group)
        if low.item() != high.item():
            agree(
                StagingError(
                    f"the ranks planned differently (fingerprint {fingerprint:#x}): "
                    "they do not see the same checkpoint"
                )
            )
        return pieces

    def _open(self, mine: List[Piece], batches: List[List[Piece]], units: List[Any]) -> Any:
        """This rank's load of its own pieces (`mine`), and the scratch buffer, once every
        rank has opened both."""
        error: Optional[BaseException] = None
        try:
            # Functions, not lists: the library takes a list's strings as globs, and these are
            # exact names.
            own_names = {p[0] for p in mine}
            own_rows = {p[0]: p[4] for p in mine if p[4] is not None}
            own = self.open_own(
                select=lambda name: name in own_names,
                rows=lambda name, _info: own_rows.get(name),
            )
            self.state["own"] = own
            self.scratch = self.torch.empty(
                _scratch_bytes(batches, units, self.relay_chunk),
                dtype=self.torch.uint8,
                device=self.device,
            )
        except Exception as e:  # noqa: BLE001
            error = e
        self.agree(error)
        return own

    def _prepare(self, batch: List[Piece], own: Any) -> Dict[int, Any]:
        """The batch prepared, once every rank has: this rank's own pieces loaded (returned,
        by their index in the batch), the buffers of the kept tensors the batch starts
        allocated (the owner's own load is the tensor when it keeps all of it: no copy)."""
        torch, rank, buffers = self.torch, self.agree.rank, self.buffers
        loaded: Dict[int, Any] = {}
        error: Optional[BaseException] = None
        try:
            for i, (name, _, _length, owner, _) in enumerate(batch):
                if owner != rank:
                    continue
                got, staged = next(own)
                if got != name:
                    raise StagingError(
                        f"internal error: rank {rank} loaded {got!r} where the plan says {name!r}"
                    )
                flat = torch.from_dlpack(staged.as_bytes()).reshape(-1)
                if flat.device != self.device:
                    flat = flat.to(self.device)  # a piece the policy assembled in host memory
                loaded[i] = flat
            for i, (name, offset, length, owner, _) in enumerate(batch):
                keep = self.kept.get(name)
                if keep is None or name in buffers:
                    continue
                whole = (
                    offset == 0 and length == self.infos[name].nbytes and keep[:2] == (0, length)
                )
                if owner == rank and whole:
                    buffers[name] = loaded[i]
                else:
                    size = keep[1] - keep[0]
                    buffers[name] = torch.empty(size, dtype=torch.uint8, device=self.device)
        except Exception as e:  # noqa: BLE001
            error = e
        self.agree(error)
        return loaded

    def _send_packed(
        self, batch: List[Piece], unit: List[int], loaded: Dict[int, Any], local: _FirstFailure
    ) -> None:
        """A run of small pieces of one owner, together: one broadcast instead of one each."""
        owner = batch[unit[0]][3]
        source_rank = self.dist.get_global_rank(self.group, owner)
        size = sum(batch[i][2] for i in unit)
        packed = self.scratch[:size]
        if owner == self.agree.rank:
            local.run(_pack, packed, [loaded[i] for i in unit])
        else:
            self.state["bytes_received"] += size
        self.dist.broadcast(packed, src=source_rank, group=self.group)
        at = 0
        for i in unit:
            name, offset, length = batch[i][:3]
            keep = self.kept.get(name)
            if keep is not None and self.buffers[name] is not loaded.get(i):
                piece = packed[at : at + length]
                local.run(_copy_overlap, self.buffers[name], keep, piece, offset, offset + length)
            at += length

    def _send_alone(
        self, batch: List[Piece], i: int, loaded: Dict[int, Any], local: _FirstFailure
    ) -> None:
        """One piece, in chunks of at most `relay_chunk` bytes: a receiver keeping all of a
        chunk receives it into the tensor's own buffer, any other into the scratch buffer."""
        dist, group, relay_chunk = self.dist, self.group, self.relay_chunk
        name, offset, length, owner = batch[i][:4]
        source_rank = dist.get_global_rank(group, owner)
        keep = self.kept.get(name)
        source = loaded.get(i)
        for c0 in range(offset, offset + length, relay_chunk):
            c1 = min(c0 + relay_chunk, offset + length)
            if owner == self.agree.rank:
                chunk = source[c0 - offset : c1 - offset]
                dist.broadcast(chunk, src=source_rank, group=group)
                if keep is not None and self.buffers[name] is not source:
                    local.run(_copy_overlap, self.buffers[name], keep, chunk, c0, c1)
                continue
            if keep is not None and keep[0] <= c0 and c1 <= keep[1]:
                kept_chunk = self.buffers[name][c0 - keep[0] : c1 - keep[0]]
                dist.broadcast(kept_chunk, src=source_rank, group=group)
            else:
                chunk = self.scratch[: c1 - c0]
                dist.broadcast(chunk, src=source_rank, group=group)
                if keep is not None:
                    local.run(_copy_overlap, self.buffers[name], keep, chunk, c0, c1)
            self.state["bytes_received"] += c1 - c0


def _units(batch: List[Piece], relay_chunk: int) -> List[List[int]]:
    """The batch's pieces in exchange units, the same on every rank (from the plan alone): runs
    of small pieces (under a quarter of `relay_chunk`) of one owner, together at most
    `relay_chunk` bytes, travel as one broadcast; any other piece travels alone, in chunks."""
    small = max(1, relay_chunk // 4)
    units: List[List[int]] = []
    run: List[int] = []
    run_bytes = 0
    for i, (_, _, length, owner, _) in enumerate(batch):
        if (
            length < small
            and run
            and batch[run[0]][3] == owner
            and run_bytes + length <= relay_chunk
        ):
            run.append(i)
            run_bytes += length
            continue
        if length < small:
            run = [i]
            run_bytes = length
            units.append(run)
        else:
            run, run_bytes = [], 0
            units.append([i])
    return units


def _scratch_bytes(
    batches: List[List[Piece]], units: List[List[List[int]]], relay_chunk: int
) -> int:
    """The most any exchange unit puts through the scratch buffer: a packed run, or one chunk."""
    most = 0
    for batch, batch_units in zip(batches, units):
        for unit in batch_units:
            lengths = [batch[i][2] for i in unit]
            most = max(most, sum(lengths) if len(unit) > 1 else min(relay_chunk, lengths[0]))
    return most


def _pack(packed: Any, pieces: List[Any]) -> None:
    """Copies `pieces` end to end into `packed`."""
    at = 0
    for piece in pieces:
        packed[at : at + piece.numel()].copy_(piece)
        at += piece.numel()


def _copy_overlap(
    buffer: Any, keep: Tuple[int, int, List[int]], chunk: Any, c0: int, c1: int
) -> None:
    """Copies the part of `chunk` (tensor bytes `c0..c1`) inside the kept bytes into `buffer`."""
    lo, hi = max(c0, keep[0]), min(c1, keep[1])
    if lo < hi:
        buffer[lo - keep[0] : hi - keep[0]].copy_(chunk[lo - c0 : hi - c0])
