#!/usr/bin/env python3
"""`safetensors_staging.load_file` against `safetensors.torch.load_file` on the CPU, in
interleaved pairs of fresh processes, with nothing else between them (no memory priming, unlike
`bench_python.py`): the load call, then one byte of every page of every tensor touched.

    python benches/bench_load_pairs.py CHECKPOINT_DIR [--pairs 12] [--cold]

Prints the median and range of each phase per loader, and the ratio of the medians of the
whole (safetensors' time over ours: above 1 is faster). `--cold` drops the page cache before
each process (root only).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = r"""
import glob, json, os, sys, time
which, path = sys.argv[1], sys.argv[2]
import torch, safetensors.torch, safetensors_staging
files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
start = time.perf_counter()
if which == "safetensors":
    out = {}
    for f in files:
        out.update(safetensors.torch.load_file(f))
else:
    out = safetensors_staging.load_file(path)
loaded = time.perf_counter()
for t in out.values():
    if t.nbytes:
        int(t.reshape(-1).view(torch.uint8)[::4096].sum())
done = time.perf_counter()
print(json.dumps({"load": loaded - start, "touch": done - loaded, "total": done - start}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--pairs", type=int, default=12)
    parser.add_argument("--cold", action="store_true")
    args = parser.parse_args()
    samples = {"staging": [], "safetensors": []}
    for _ in range(args.pairs):
        for which in samples:
            if args.cold:
                subprocess.run(["sync"], check=True)
                with open("/proc/sys/vm/drop_caches", "w") as f:
                    f.write("1\n")
            out = subprocess.run(
                [sys.executable, "-c", CHILD, which, args.checkpoint],
                check=True,
                capture_output=True,
                text=True,
            )
            samples[which].append(json.loads(out.stdout.strip().splitlines()[-1]))
    medians = {}
    for which, rows in samples.items():
        line = []
        for phase in ("load", "touch", "total"):
            values = [r[phase] for r in rows]
            line.append(
                f"{phase} {statistics.median(values):.4f} s ({min(values):.4f}-{max(values):.4f})"
            )
        medians[which] = statistics.median(r["total"] for r in rows)
        print(f"{which:12} " + ", ".join(line))
    ratio = medians["safetensors"] / medians["staging"]
    print(
        f"x safetensors (total, medians of {args.pairs}{', cold' if args.cold else ''}): {ratio:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
