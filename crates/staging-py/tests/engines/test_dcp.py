"""`safetensors_staging.dcp.StagingStorageReader` against torch's own `HuggingFaceStorageReader`:
2 gloo ranks load a state dict of DTensors sharded across them (along dimension 0, along
dimension 1, replicated) from the same Hugging Face checkpoint; both readers give equal local
shards, equal to the rank's part of the file's tensors, and each rank reads only the rows its
shards cover."""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import Any, Dict

import torch
import torch.multiprocessing as mp

TENSORS = {
    "a": ((64, 32), torch.float32),  # Shard(0): half the rows each
    "b": ((48, 16), torch.bfloat16),  # Shard(0)
    "c": ((10,), torch.float32),  # replicated: all of it on each rank
    "d": ((32, 64), torch.float32),  # Shard(1): a column block spans every row
}


def full_tensors() -> Dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    return {
        name: torch.randn(shape, generator=g).to(dtype) for name, (shape, dtype) in TENSORS.items()
    }


def _worker(rank: int, world: int, directory: str, out: str) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from safetensors_staging.dcp import StagingStorageReader

    dist.init_process_group(
        "gloo",
        init_method=f"file://{out}/rendezvous",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )
    result: Dict[str, Any] = {"rank": rank}
    try:
        mesh = init_device_mesh("cpu", (world,))
        placements = {"a": [Shard(0)], "b": [Shard(0)], "c": [Replicate()], "d": [Shard(1)]}

        def empty_state() -> Dict[str, Any]:
            return {
                name: distribute_tensor(torch.zeros(shape, dtype=dtype), mesh, placements[name])
                for name, (shape, dtype) in TENSORS.items()
            }

        ours, theirs = empty_state(), empty_state()
        reader = StagingStorageReader(directory)
        dcp.load(ours, storage_reader=reader)
        dcp.load(theirs, storage_reader=HuggingFaceStorageReader(directory))
        threaded = empty_state()  # the two files read at once
        dcp.load(threaded, storage_reader=StagingStorageReader(directory, thread_count=2))
        full = full_tensors()
        bad = []
        for name in TENSORS:
            got, want = ours[name].to_local(), theirs[name].to_local()
            part = full[name]
            if name in ("a", "b"):
                n = part.shape[0] // world
                part = part[rank * n : (rank + 1) * n]
            elif name == "d":
                n = part.shape[1] // world
                part = part[:, rank * n : (rank + 1) * n]
            if not (
                torch.equal(got, want)
                and torch.equal(got, part)
                and got.dtype == part.dtype
                and torch.equal(threaded[name].to_local(), part)
            ):
                bad.append(name)
        result.update({"bad": bad, "bytes_read": reader.bytes_read, "reads": reader.tensors_read})
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        result["error"] = f"{type(e).__name__}: {e}"
    finally:
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump(result, f)
        dist.destroy_process_group()


def test_dcp_load_through_staging_equals_torchs_reader_and_reads_each_ranks_share(
    tmp_path: Path,
) -> None:
    import safetensors.torch

    checkpoint = tmp_path / "hf"
    checkpoint.mkdir()
    full = full_tensors()
    safetensors.torch.save_file(
        {k: full[k] for k in ("a", "b")}, checkpoint / "model-00001-of-00002.safetensors"
    )
    safetensors.torch.save_file(
        {k: full[k] for k in ("c", "d")}, checkpoint / "model-00002-of-00002.safetensors"
    )
    out = tmp_path / "out"
    out.mkdir()
    mp.start_processes(
        _worker, args=(2, str(checkpoint), str(out)), nprocs=2, join=True, start_method="spawn"
    )
    results = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    for r in results:
        assert "error" not in r, r
        assert r["bad"] == [], r
        # a: 32 of 64 rows of 32 F32; b: 24 of 48 rows of 16 BF16; c: all 10 F32; d: a column
        # block, 32 of the 64 F32 columns of each of its 32 rows.
        assert r["bytes_read"] == 32 * 32 * 4 + 24 * 16 * 2 + 10 * 4 + 32 * 32 * 4, r
        assert r["reads"] == 4, r
