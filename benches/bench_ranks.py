#!/usr/bin/env python3
"""Many ranks on one machine, CPU, gloo: `load_file(path, process_group=...)` (each byte read once
across the group, then broadcast) against every rank calling `load_file(path)` on its own.

    python benches/bench_ranks.py CHECKPOINT_DIR [--ranks 1,2,3] [--rounds 3]

For each group size n, n processes (torch.multiprocessing, gloo over loopback) run both ways,
alternating, after a barrier; each rank reports its wall time and the bytes it read. The table
gives the slowest rank's wall time (the group is as fast as its slowest rank; median over
rounds) and the bytes read per rank.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import tempfile
import time
from pathlib import Path


def worker(rank: int, world: int, path: str, rounds: int, out: str) -> None:
    import torch.distributed as dist

    import safetensors_staging as st

    dist.init_process_group(
        "gloo",
        init_method=f"file://{out}/rendezvous",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=600),
    )
    results = []
    for _ in range(rounds):
        for mode in ("group", "alone"):
            dist.barrier()
            start = time.perf_counter()
            with st.stage(path, process_group=dist.group.WORLD if mode == "group" else None) as it:
                tensors = dict(it)
                report = it.report()
            seconds = time.perf_counter() - start
            results.append(
                {
                    "mode": mode,
                    "seconds": seconds,
                    "bytes_read": report["bytes_read"],
                    "bytes_received": report.get("bytes_received", 0),
                    "bytes": sum(t.nbytes for t in tensors.values()),
                }
            )
            del tensors
    Path(out, f"rank{rank}.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as mp

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("checkpoint")
    parser.add_argument("--ranks", default="1,2,3")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for f in Path(args.checkpoint).glob("*.safetensors"):
        with open(f, "rb") as fh:
            while fh.read(64 << 20):
                pass
    print(
        "| ranks | way | wall s, slowest rank (median) | GiB read per rank | GiB received per rank |"
    )
    print("| --- | --- | --- | --- | --- |")
    for n in map(int, args.ranks.split(",")):
        with tempfile.TemporaryDirectory() as out:
            mp.spawn(worker, args=(n, args.checkpoint, args.rounds, out), nprocs=n, join=True)
            ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(n)]
        for mode, label in (
            ("alone", "each rank `load_file` on its own"),
            ("group", "`load_file(..., process_group=...)`"),
        ):
            walls = [
                max(r[i]["seconds"] for r in ranks)
                for i in range(len(ranks[0]))
                if ranks[0][i]["mode"] == mode
            ]
            read = [
                r[i]["bytes_read"] for r in ranks for i in range(len(r)) if r[i]["mode"] == mode
            ]
            received = [
                r[i]["bytes_received"] for r in ranks for i in range(len(r)) if r[i]["mode"] == mode
            ]
            gib = 1 << 30
            print(
                f"| {n} | {label} | {statistics.median(walls):.2f} | {min(read) / gib:.2f}-{max(read) / gib:.2f} | "
                f"{min(received) / gib:.2f}-{max(received) / gib:.2f} |"
            )


if __name__ == "__main__":
    main()
