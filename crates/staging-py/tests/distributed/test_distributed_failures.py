"""A rank that fails after the ranks agreed on the plan (out of memory on one GPU is the realistic
case: a receive buffer, a copy) fails every rank within seconds, and the group stays usable.
gloo, 2 ranks spawned here; the process group's timeout is short, so a rank left waiting in a
collective fails the test in seconds instead of hanging it."""

from __future__ import annotations

import datetime
import json
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# What a rank left waiting in a collective would wait, at most; the test allows far less.
GROUP_TIMEOUT = datetime.timedelta(seconds=15)
QUICK = 5.0
OOM = "injected: CUDA out of memory. Tried to allocate 2.00 MiB"


def _inject(fault: str) -> Callable[[], None]:
    """Makes this rank fail in one step of the exchange; returns the undo."""
    if fault == "allocation":
        original = torch.empty
        calls = {"n": 0}

        def empty(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("dtype") is torch.uint8:
                calls["n"] += 1
                if calls["n"] == 3:  # past the first exchange's own buffers
                    raise torch.OutOfMemoryError(OOM)
            return original(*args, **kwargs)

        torch.empty = empty
        return lambda: setattr(torch, "empty", original)
    assert fault == "copy"
    copy = torch.Tensor.copy_

    def failing(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("injected: copy failed")

    torch.Tensor.copy_ = failing
    return lambda: setattr(torch.Tensor, "copy_", copy)


def _worker(rank: int, world: int, fault: str, path: str, out: str) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"file://{out}/rendezvous",
        rank=rank,
        world_size=world,
        timeout=GROUP_TIMEOUT,
    )
    import safetensors_staging as st

    undo = _inject(fault) if rank == 1 else (lambda: None)
    result: Dict[str, Any] = {"rank": rank}
    start = time.perf_counter()
    try:
        got = st.load_file(
            path, process_group=dist.group.WORLD, relay_chunk=1 << 18, batch_bytes=1 << 20
        )
        result["finished"] = len(got)
    except Exception as e:  # noqa: BLE001 - every class is reported to the test
        result.update(error=type(e).__name__, message=str(e), kind=getattr(e, "kind", None))
    result["seconds"] = time.perf_counter() - start
    undo()
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    # The group is usable after the failure: a collective, then a whole load, byte-exact.
    try:
        flag = torch.ones(1)
        dist.all_reduce(flag)
        result["all_reduce"] = flag.item()
        again = st.load_file(
            path, process_group=dist.group.WORLD, relay_chunk=1 << 18, batch_bytes=1 << 20
        )
        plain = st.load_file(path)
        result["again"] = sorted(again) == sorted(plain) and all(
            torch.equal(again[n], plain[n]) for n in plain
        )
    except Exception as e:  # noqa: BLE001
        result["after"] = f"{type(e).__name__}: {e}"
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def _run(fault: str, path: str, tmp_path: Path) -> List[Dict[str, Any]]:
    out = tmp_path / f"ranks-{fault}"
    out.mkdir()
    context = mp.spawn(_worker, args=(2, fault, path, str(out)), nprocs=2, join=False)
    deadline = time.monotonic() + 90
    try:
        while not context.join(timeout=1):
            if time.monotonic() > deadline:
                break
    finally:
        hung = [p.pid for p in context.processes if p.is_alive()]
        for p in context.processes:
            if p.is_alive():
                p.kill()
    results = [
        json.loads(f.read_text()) if (f := out / f"rank{r}.json").exists() else {"rank": r}
        for r in range(2)
    ]
    assert not hung, f"ranks still running after 90 s: {results}"
    return results


@pytest.mark.parametrize("fault", ["allocation", "copy"])
def test_a_rank_failing_mid_exchange_fails_every_rank_quickly(
    fault: str, minilm_dir: Path, tmp_path: Path
) -> None:
    results = _run(fault, str(minilm_dir), tmp_path)
    cause, cls, kind = {
        "allocation": (OOM, "OutOfMemoryError", "host-allocation"),
        "copy": ("injected: copy failed", "StagingError", "internal"),
    }[fault]
    for r in results:
        assert "finished" not in r, r  # nobody went on with a partial model
        assert (r.get("error"), r.get("kind")) == (cls, kind), r
        assert r["message"] == f"rank 1: {cause}", r
        assert r["seconds"] < QUICK, r
        assert r.get("all_reduce") == 2 and r.get("again") is True, r
