#!/usr/bin/env python3
"""Python loaders side by side on one checkpoint, in one run: `safetensors_staging.load_file`
(torch and NumPy) against `safetensors.torch.load_file` and `safetensors.numpy.load_file`; and
the drop-in API: `safe_open` + `get_tensor` for every key, and tensor-parallel slicing of every 2-D weight into 4 parts through
`get_slice(name)[a:b]`, along dimension 0 (`slice0`) and along dimension 1 (`slice1`), with the
bytes this package read (`bytes_read`; safetensors maps the file, so its bytes read are the pages
the slices touch).

    python benches/bench_python.py CHECKPOINT_DIR [--device cpu|cuda:0] [--rounds 3] [--write GIB]
        [--cold]

`--write GIB` first writes a synthetic F16 checkpoint of that size into CHECKPOINT_DIR (F16, so
that `safetensors.numpy` can load it too): 4 shards, an embedding over 256 MiB, layers of 8-64 MiB
matrices and small norms.

Each load runs in a fresh process (so peak RSS is that loader's alone), rounds interleaved, the
page cache warmed first, memory of the checkpoint's size touched and freed by another process
just before each (this VM returns idle memory to its hypervisor; see stage-bench); the table gives the median GB/s of the load call and the process's peak
RSS above what it held after importing. With `--device cuda:0` the staging rows load onto the GPU
and `safetensors.torch` uses its `device=` argument; peak device memory comes from
`torch.cuda.max_memory_allocated` for torch's allocator and `nvidia-smi`-free `torch.cuda.mem_get_info`
for the rest. A pinned host-to-device copy of the same size gives the physical limit.

The measure users feel is "load + every page read": the time until the caller's tensors are
usable, one byte of every page of every tensor touched after the load (so tensors `safetensors`
maps lazily pay their page faults there; nobody's tensors are cloned). The ratio column is on
that measure.

`--cold` adds a cold row for each loader: `sync; echo 1 > /proc/sys/vm/drop_caches` before each
of its samples, so the checkpoint comes off the disk (root only; where the page cache cannot be
dropped the cold rows are skipped, and the run says so).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, sys, time, glob, os
which, path, device = sys.argv[1], sys.argv[2], sys.argv[3]
import numpy, torch
import safetensors.torch, safetensors.numpy
import safetensors_staging, safetensors_staging.numpy
files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
cuda = device.startswith("cuda")
if cuda:
    torch.cuda.init(); torch.empty(1, device=device)
    free0 = torch.cuda.mem_get_info()[0]
base = rss()
bytes_read = None
start = time.perf_counter()
if which == "pinned-h2d":
    total = sum(os.path.getsize(f) for f in files)
    host = torch.empty(total, dtype=torch.uint8, pin_memory=True)
    torch.cuda.synchronize(); start = time.perf_counter()
    dev = host.to(device, non_blocking=True); torch.cuda.synchronize()
    out = {"x": dev}
elif which == "staging.torch":
    out = safetensors_staging.load_file(path, device)
elif which == "staging.numpy":
    out = safetensors_staging.numpy.load_file(path, unsupported_dtypes="uint8")
elif which == "safetensors.torch":
    out = {}
    for f in files:
        out.update(safetensors.torch.load_file(f, device=device))
elif which == "safetensors.numpy":
    out = {}
    for f in files:
        out.update(safetensors.numpy.load_file(f))
elif which == "safetensors.safe_open":
    out = {}
    for f in files:
        with safetensors.safe_open(f, framework="pt", device=device) as h:
            for k in h.offset_keys():
                out[k] = h.get_tensor(k)
elif which == "staging.safe_open":
    with safetensors_staging.safe_open(path, framework="pt", device=device) as h:
        out = {k: h.get_tensor(k) for k in h.offset_keys()}
        bytes_read = h.bytes_read
elif which.endswith((".slice0", ".slice1")):
    dim = int(which[-1])
    out = {}
    opened = ([safetensors_staging.safe_open(path, framework="pt", device=device)] if which.startswith("staging")
              else [safetensors.safe_open(f, framework="pt", device=device) for f in files])
    for h in opened:
        for k in h.offset_keys():
            sl = h.get_slice(k)
            shape = sl.get_shape()
            if len(shape) != 2:
                continue
            n = shape[dim]
            for part in range(4):
                a, b = part * n // 4, (part + 1) * n // 4
                piece = sl[a:b] if dim == 0 else sl[:, a:b]
                out[f"{k}.{part}"] = piece
    if which.startswith("staging"):
        bytes_read = opened[0].bytes_read
if cuda:
    torch.cuda.synchronize()
seconds = time.perf_counter() - start
# Ready to use: one byte of every page read (safetensors on the CPU maps the file and reads
# nothing until touched; this is where it pays).
for t in out.values():
    if t.nbytes and not cuda:
        flat = t.reshape(-1).view(numpy.uint8) if isinstance(t, numpy.ndarray) else t.reshape(-1).view(torch.uint8)
        int(flat[::4096].sum())
touched = time.perf_counter() - start
nbytes = sum(int(t.nbytes) for t in out.values())
# VmHWM, not ru_maxrss: Linux keeps ru_maxrss across exec (a child would report its parent's
# peak after writing the checkpoint).
with open("/proc/self/status") as f:
    peak = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM:"))
device_used = (free0 - torch.cuda.mem_get_info()[0]) if cuda else 0
print(json.dumps({"seconds": seconds, "touched": touched, "bytes": nbytes, "peak_rss_above_base": peak - base, "device_bytes": device_used, "bytes_read": bytes_read}))
"""


def write_synthetic(directory: Path, gib: float) -> None:
    import numpy as np

    directory.mkdir(parents=True, exist_ok=True)
    total = int(gib * (1 << 30))
    rng = np.random.default_rng(0)
    specs = [("model.embed_tokens.weight", (151_936 // 8 * 8, 1024))]
    layer = 0
    size = 2 * specs[0][1][0] * specs[0][1][1]
    while size < total:
        for name, shape in (
            ("q_proj", (2048, 1024)),
            ("k_proj", (512, 1024)),
            ("v_proj", (512, 1024)),
            ("o_proj", (1024, 2048)),
            ("gate_proj", (3072, 1024)),
            ("up_proj", (3072, 1024)),
            ("down_proj", (1024, 3072)),
            ("input_layernorm", (1024,)),
            ("post_attention_layernorm", (1024,)),
        ):
            specs.append((f"model.layers.{layer}.{name}.weight", shape))
            size += 2 * int(np.prod(shape))
        layer += 1
    per_shard = -(-len(specs) // 4)
    weight_map = {}
    for i in range(4):
        chunk = specs[i * per_shard : (i + 1) * per_shard]
        fname = f"model-{i + 1:05}-of-00004.safetensors"
        header, offset = {}, 0
        for name, shape in chunk:
            n = 2 * int(np.prod(shape))
            header[name] = {
                "dtype": "F16",
                "shape": list(shape),
                "data_offsets": [offset, offset + n],
            }
            offset += n
            weight_map[name] = fname
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        with open(directory / fname, "wb") as f:
            f.write(len(text).to_bytes(8, "little"))
            f.write(text)
            for _name, shape in chunk:
                f.write(
                    rng.standard_normal(int(np.prod(shape)), dtype=np.float32)
                    .astype(np.float16)
                    .tobytes()
                )
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": size}, "weight_map": weight_map})
    )
    subprocess.run(["sync"], check=False)


def drop_page_cache() -> bool:
    """`sync; echo 1 > /proc/sys/vm/drop_caches`; False where not permitted."""
    subprocess.run(["sync"], check=False)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        return True
    except OSError:
        return False


def warm_page_cache(directory: Path, pattern: str = "*.safetensors") -> None:
    """Reads every file under `directory` matching `pattern` once, into the page cache."""
    for f in sorted(p for p in directory.rglob(pattern) if p.is_file()):
        with open(f, "rb") as fh:
            while fh.read(64 << 20):
                pass


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--cold", action="store_true", help="add cold rows (drop the page cache before each)"
    )
    parser.add_argument(
        "--write",
        type=float,
        metavar="GIB",
        help="write a synthetic F16 checkpoint of this size first",
    )
    args = parser.parse_args()
    if args.write:
        write_synthetic(args.checkpoint, args.write)
    loaders = [
        "staging.torch",
        "safetensors.torch",
        "staging.safe_open",
        "safetensors.safe_open",
        "staging.slice0",
        "safetensors.slice0",
        "staging.slice1",
        "safetensors.slice1",
    ]
    if args.device == "cpu":
        loaders += ["staging.numpy", "safetensors.numpy"]
    else:
        loaders.insert(0, "pinned-h2d")
    if args.cold:
        if drop_page_cache():
            loaders += [f"{name} (cold)" for name in loaders if name != "pinned-h2d"]
        else:
            print("--cold: the page cache cannot be dropped here (needs root): cold rows skipped")
    warm_page_cache(args.checkpoint)
    total = sum(f.stat().st_size for f in args.checkpoint.glob("*.safetensors"))
    runs: dict[str, list[dict]] = {name: [] for name in loaders}
    for _ in range(args.rounds):
        for name in loaders:
            # This VM hands idle memory back to its hypervisor; touching and freeing the
            # checkpoint's size first gives every loader the same memory (as stage-bench does).
            subprocess.run(
                [sys.executable, "-c", f"import numpy; numpy.ones({total}, dtype=numpy.uint8)"],
                check=True,
            )
            cold = name.endswith(" (cold)")
            if cold:
                drop_page_cache()
            out = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    CHILD,
                    name.removesuffix(" (cold)"),
                    str(args.checkpoint),
                    args.device,
                ],
                capture_output=True,
                text=True,
            )
            if out.returncode != 0:
                sys.exit(f"{name} failed:\n{out.stderr}")
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
            if cold:
                warm_page_cache(args.checkpoint)  # the next warm row finds it cached
    gib = 1 << 30
    limit = None
    if "pinned-h2d" in runs:
        limit = statistics.median(r["bytes"] / r["seconds"] for r in runs["pinned-h2d"])
    print(
        f"| loader ({args.device}) | GiB | GB/s, load call | GB/s, load + every page read | x safetensors (load + read) | spread (s) | bytes read (GiB) | peak RSS above imports (MiB) | device bytes held (MiB) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in loaders:
        rs = runs[name]
        rate = statistics.median(r["bytes"] / r["seconds"] for r in rs)
        rs_peak = max(r["peak_rss_above_base"] for r in rs) / (1 << 20)
        dev = max(r["device_bytes"] for r in rs) / (1 << 20)
        ready = statistics.median(r["bytes"] / r["touched"] for r in rs)
        ratio = ""
        ref = {
            "staging.torch": "safetensors.torch",
            "staging.numpy": "safetensors.numpy",
            "staging.safe_open": "safetensors.safe_open",
            "staging.slice0": "safetensors.slice0",
            "staging.slice1": "safetensors.slice1",
        }.get(name.removesuffix(" (cold)"))
        if ref and name.endswith(" (cold)"):
            ref += " (cold)"
        if ref:
            ref_ready = statistics.median(r["bytes"] / r["touched"] for r in runs[ref])
            ratio = f"{ready / ref_ready:.2f}"
        of_limit = f" ({rate / limit:.0%} of pinned H2D)" if limit and name != "pinned-h2d" else ""
        spread = f"{min(r['touched'] for r in rs):.2f}-{max(r['touched'] for r in rs):.2f}"
        read = rs[0].get("bytes_read")
        read = f"{read / gib:.2f}" if read is not None else ""
        print(
            f"| `{name}` | {rs[0]['bytes'] / gib:.2f} | {rate / 1e9:.2f}{of_limit} | {ready / 1e9:.2f} | {ratio} | {spread} | {read} | {rs_peak:.0f} | {dev:.0f} |"
        )


if __name__ == "__main__":
    main()
