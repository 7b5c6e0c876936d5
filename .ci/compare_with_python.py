#!/usr/bin/env python3
"""Check `stage --json --checksums` against Python's `safetensors` library, tensor by tensor.

usage: compare_with_python.py STAGE_BINARY CHECKPOINT [extra stage arguments...]

Runs the stage binary on CHECKPOINT (a directory, an index file or a .safetensors file), reads
every file it reports with `safetensors.deserialize` (raw bytes, any dtype, no framework), and
compares names, dtypes, shapes and SHA-256 of every tensor. Exits 1 on any difference.

With `--select GLOB` among the extra arguments, exactly the tensors matching a glob must have
been loaded; with `--rows GLOB=START:END` (or `GLOB=RANK/PARTS`), a matching tensor must hold
exactly the rows Python reads with `safe_open(...).get_slice(name)[START:END]` (NumPy dtypes;
raw row bytes otherwise). `bytes_read` must equal the bytes of what was loaded.
"""

import fnmatch
import hashlib
import json
import subprocess
import sys

from safetensors import deserialize, safe_open


def flag_values(args, flag):
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == flag]


def rows_for(name, dim0, rules):
    """The rows `stage --rows` asks for `name`: the first matching rule, as stage applies them."""
    for rule in rules:
        pattern, spec = rule.rsplit("=", 1)
        if not fnmatch.fnmatchcase(name, pattern):
            continue
        if ":" in spec:
            start, end = (int(x) for x in spec.split(":"))
            return start, end
        rank, parts = (int(x) for x in spec.split("/"))
        base, extra = divmod(dim0, parts)
        start = rank * base + min(rank, extra)
        return start, start + base + (1 if rank < extra else 0)
    return None


def expected_bytes(file, name, info, rows):
    """The bytes Python safetensors gives for `name` (or its rows)."""
    if rows is None:
        return bytes(info["data"])
    start, end = rows
    if start == end:  # no rows (Python's get_slice refuses an empty range at the end)
        return b""
    try:
        with safe_open(file, framework="numpy") as f:
            return f.get_slice(name)[start:end].tobytes()
    except (TypeError, ValueError):  # a dtype NumPy lacks (BF16, F8): cut the raw row bytes
        data = bytes(info["data"])
        row = len(data) // info["shape"][0] if info["shape"][0] else 0
        return data[start * row : end * row]


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
    selects, row_rules = flag_values(extra, "--select"), flag_values(extra, "--rows")

    reference, file_of = {}, {}
    # The files stage read from (with a selection, the files holding what it selected).
    for file in sorted({t["file"] for t in report["tensor_list"]}):
        with open(file, "rb") as f:
            for name, info in deserialize(f.read()):
                reference[name], file_of[name] = info, file

    problems = []
    wanted = {
        n for n in reference if not selects or any(fnmatch.fnmatchcase(n, g) for g in selects)
    }
    if set(staged) != wanted:
        problems.append(
            f"names differ: only staged {sorted(set(staged) - wanted)[:5]}, "
            f"only selected in files {sorted(wanted - set(staged))[:5]}"
        )
    for name in sorted(set(staged) & set(reference)):
        s, r = staged[name], reference[name]
        rows = rows_for(name, r["shape"][0], row_rules) if r["shape"] else None
        want_shape = list(r["shape"]) if rows is None else [rows[1] - rows[0], *r["shape"][1:]]
        if (s.get("rows") or None) != (list(rows) if rows else None):
            problems.append(f"{name}: rows {s.get('rows')} != {rows}")
        want = hashlib.sha256(expected_bytes(file_of[name], name, r, rows)).hexdigest()
        if s["sha256"] != want:
            problems.append(f"{name}: sha256 {s['sha256']} != {want}")
        if s["dtype"].upper() != r["dtype"].upper():
            problems.append(f"{name}: dtype {s['dtype']} != {r['dtype']}")
        if list(s["shape"]) != want_shape:
            problems.append(f"{name}: shape {s['shape']} != {want_shape}")
    loaded = sum(t["bytes"] for t in report["tensor_list"])
    if report.get("bytes_read") != loaded:
        problems.append(f"bytes_read {report.get('bytes_read')} != {loaded} bytes loaded")
    paths = {p: report["paths"][p]["tensors"] for p in ("destination", "device", "host")}
    if problems:
        for p in problems:
            print(p, file=sys.stderr)
        print(f"FAIL: {len(problems)} differences over {len(staged)} tensors", file=sys.stderr)
        return 1
    narrowed = sum(1 for t in report["tensor_list"] if t.get("rows"))
    print(
        f"OK: {len(staged)} tensors ({narrowed} row ranges), {report['bytes']} bytes, "
        f"bytes_read {report['bytes_read']}, every SHA-256 equal to Python safetensors' "
        f"(paths {paths}, backend {report['backend']})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
