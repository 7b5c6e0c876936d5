#!/usr/bin/env python3
"""Load calls of this package against another version of it (a baseline), in fresh processes,
rounds interleaved: medians, ranges and the ratio baseline / this.

    python benches/bench_versions.py CHECKPOINT_DIR --baseline DIR [--shards N] [--rounds 7]
        [--doors load_file,load_file-map-false,numpy,safe_open]

`--baseline DIR` is a directory holding the other version's `safetensors_staging` package
(its release wheel unzipped there: `python -m zipfile -e safetensors_staging-*.whl DIR`),
put first on that child's `PYTHONPATH`; this version is the one the running Python imports.
With `--shards N`, a checkpoint of N shards of two small tensors each is written into
CHECKPOINT_DIR first, unless one is there. Each child times the load call alone
(`time.perf_counter` around it), after its imports.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import sys, time
directory, door = sys.argv[1], sys.argv[2]
import torch, safetensors_staging as st, safetensors_staging.numpy as stn
start = time.perf_counter()
if door == "load_file":
    out = st.load_file(directory)
elif door == "load_file-map-false":
    out = st.load_file(directory, map=False)
elif door == "numpy":
    out = stn.load_file(directory, unsupported_dtypes="uint8")
elif door == "safe_open":
    with st.safe_open(directory, framework="pt") as f:
        out = {k: f.get_tensor(k) for k in f.offset_keys()}
else:
    raise SystemExit(f"unknown door {door}")
print(time.perf_counter() - start, len(out))
"""


def write_shards(directory: Path, shards: int) -> None:
    import numpy as np
    import safetensors.numpy

    if (directory / "model.safetensors.index.json").exists():
        return
    directory.mkdir(parents=True, exist_ok=True)
    weight_map = {}
    for i in range(shards):
        name = f"model-{i + 1:05}-of-{shards:05}.safetensors"
        tensors = {
            f"s{i}.w": np.full((4, 3), i, np.float32),
            f"s{i}.b": np.arange(7 + i % 5, dtype=np.uint8),
        }
        safetensors.numpy.save_file(tensors, directory / name)
        weight_map.update({key: name for key in tensors})
    index = {"metadata": {}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--baseline", type=Path, required=True)
    parser.add_argument("--shards", type=int)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--doors", default="load_file,load_file-map-false,numpy,safe_open")
    args = parser.parse_args()
    if args.shards:
        write_shards(args.checkpoint, args.shards)
    doors = args.doors.split(",")
    versions = {
        "baseline": {**os.environ, "PYTHONPATH": str(args.baseline)},
        "this": {k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    }
    seconds: dict = {(door, v): [] for door in doors for v in versions}
    for r in range(args.rounds):
        order = list(versions) if r % 2 == 0 else list(reversed(versions))
        for door in doors:
            for version in order:
                done = subprocess.run(
                    [sys.executable, "-c", CHILD, str(args.checkpoint), door],
                    env=versions[version],
                    capture_output=True,
                    text=True,
                )
                if done.returncode:
                    raise SystemExit(f"{version} {door}: {done.stderr[-2000:]}")
                seconds[(door, version)].append(float(done.stdout.split()[0]))
    print("| door | baseline (s) | this (s) | baseline / this |")
    print("| --- | --- | --- | --- |")
    for door in doors:
        base, this = seconds[(door, "baseline")], seconds[(door, "this")]
        mb, mt = statistics.median(base), statistics.median(this)
        print(
            f"| {door} | {mb:.4f} ({min(base):.4f}-{max(base):.4f}) | "
            f"{mt:.4f} ({min(this):.4f}-{max(this):.4f}) | {mb / mt:.2f} |"
        )


if __name__ == "__main__":
    main()
