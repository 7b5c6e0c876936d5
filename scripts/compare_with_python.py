#!/usr/bin/env python3
"""Check `stage --json --checksums` against Python's `safetensors` library, tensor by tensor.

usage: compare_with_python.py STAGE_BINARY CHECKPOINT [extra stage arguments...]

Runs the stage binary on CHECKPOINT (a directory, an index file or a .safetensors file), reads
every file it reports with `safetensors.deserialize` (raw bytes, any dtype, no framework), and
compares names, dtypes, shapes and SHA-256 of every tensor. Exits 1 on any difference.
"""

import hashlib
import json
import subprocess
import sys

from safetensors import deserialize


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    stage, checkpoint, extra = sys.argv[1], sys.argv[2], sys.argv[3:]
    run = subprocess.run(
        [stage, checkpoint, "--json", "--checksums", *extra],
        capture_output=True,
        text=True,
        check=False,
    )
    if run.returncode != 0:
        print(f"stage failed ({run.returncode}): {run.stderr.strip()}", file=sys.stderr)
        return 1
    report = json.loads(run.stdout)
    staged = {t["name"]: t for t in report["tensor_list"]}

    reference = {}
    for file in sorted({t["file"] for t in report["tensor_list"]}):
        with open(file, "rb") as f:
            for name, info in deserialize(f.read()):
                reference[name] = info

    problems = []
    if set(staged) != set(reference):
        problems.append(f"names differ: only staged {sorted(set(staged) - set(reference))[:5]}, "
                        f"only in files {sorted(set(reference) - set(staged))[:5]}")
    for name in sorted(set(staged) & set(reference)):
        s, r = staged[name], reference[name]
        want = hashlib.sha256(bytes(r["data"])).hexdigest()
        if s["sha256"] != want:
            problems.append(f"{name}: sha256 {s['sha256']} != {want}")
        if s["dtype"].upper() != r["dtype"].upper():
            problems.append(f"{name}: dtype {s['dtype']} != {r['dtype']}")
        if list(s["shape"]) != list(r["shape"]):
            problems.append(f"{name}: shape {s['shape']} != {r['shape']}")
    paths = {p: report["paths"][p]["tensors"] for p in ("destination", "device", "host")}
    if problems:
        for p in problems:
            print(p, file=sys.stderr)
        print(f"FAIL: {len(problems)} differences over {len(staged)} tensors", file=sys.stderr)
        return 1
    print(f"OK: {len(staged)} tensors, {report['bytes']} bytes, every SHA-256 equal to Python "
          f"safetensors' bytes (paths {paths}, backend {report['backend']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
