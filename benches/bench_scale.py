#!/usr/bin/env python3
"""What a load costs as checkpoints get wider: this package against `safetensors` on checkpoints
of many small tensors and many shards, and on a sparse checkpoint shaped like DeepSeek-R1/V3
(issue 50's measure).

Checkpoints, written once into `--work` (plain Python: the header JSON, then the data):

- the tensor sweep: 1,000 to 200,000 F32 tensors of 256 elements (1 KiB) in 60 shards;
- the shard sweep: 60,000 such tensors in 1 to 2,000 shards;
- `deepseek`: the names and shapes of DeepSeek-V3 (61 layers, 256 routed experts of FP8
  weights with F32 block scales, MLA attention; ~91,000 tensors, 163 shards, ~671 GB) as
  sparse files: real headers, the data a hole (it reads as zeros), so the disk holds only
  the headers.

Rows, each sample a fresh process, the page cache warm, rounds interleaved; timed from the
child's start to its "done" mark (Python start-up and imports included), and after its imports;
every tensor handed out has one byte of each page touched (a mapped tensor is read only then):

- `safetensors.torch.load_file` of every shard (`st load_file`) against ours of the list of
  shards (`load_file(shards)`) and of the directory (`load_file(directory)`, through the index);
- `safe_open` + `get_tensor` of every key of every shard, `safetensors`' against ours;
- an expert-parallel rank of DeepSeek's width: vLLM's filter (rank 0 of 8 keeps experts 0-31)
  on a checkpoint of DeepSeek-V3's names and dtypes, every tensor tiny (90,000 tensors in 163
  shards, 9 MB): ours as `load_file(index, select=filter)`, `safetensors` as vLLM's default
  loader goes (every shard opened, its keys filtered, `get_tensor`);
- on `deepseek` (no full load: 671 GB): one 14 KB tensor (`model.layers.10.input_layernorm
  .weight`), one layer (`model.layers.10.*`) and eight experts of it, by `stage --select`, by
  ours (`load_file(index, select=...)`) and by `safetensors` (the index read, then `safe_open`
  of the shards that hold them); peak RSS of each, and what it holds over the bytes loaded
  and over a process that only imports torch and the library (a row of its own). Each of these
  samples starts with the selection's bytes in the page cache (a plain read before it, then a
  second's pause) and the rows run in each of their six orders over six rounds: the process
  after `stage` (11 GB of memory of its own for one layer) otherwise starts with its page
  cache evicted while the kernel takes that memory back, and paid for it.

Usage:

    PYTHONPATH=/work/artifacts/site python benches/bench_scale.py [--rounds 3] [--work DIR]
        [--tensors 1000,10000,60000,200000] [--shards 1,10,60,500,2000] [--no-deepseek]
        [--stage target/release/stage] [--json OUT] [--plot OUT.png]

The log-log plot (time against tensor count, and against shard count, both libraries) is made
when `matplotlib` is importable, else the run says it was not made.
"""

from __future__ import annotations

import argparse
import fnmatch
import itertools
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

ELEMENTS = 256  # per small tensor: F32, 1 KiB

# Children: argv = [mode, *paths]; print "IMPORTED <t>", then "DONE <t> <tensors>".
CHILD = r"""
import json, sys, time
mode, paths = sys.argv[1], sys.argv[2:]
if mode.startswith("st_"):
    import safetensors.torch as lib
    from safetensors import safe_open
else:
    import safetensors_staging.torch as lib
    from safetensors_staging import safe_open
import torch
print("IMPORTED", time.monotonic(), flush=True)
n = 0
import ctypes
def touch(t):
    # One byte of every page: what a caller using the tensor pays (a mapped tensor is read
    # only when touched). A tensor within a page or two is touched by address (its first and
    # last byte, 0.3 us), a bigger one through torch (a few us): the same for both libraries.
    size = t.numel() * t.element_size()
    if size == 0:
        return 0
    if size <= 4096:
        at = t.data_ptr()
        return ctypes.c_ubyte.from_address(at).value + ctypes.c_ubyte.from_address(at + size - 1).value
    b = t.reshape(-1).view(torch.uint8)
    return int(b[::4096].sum())
if mode in ("st_load_file", "ours_load_file_shards"):
    if mode == "st_load_file":
        for p in paths:
            for t in lib.load_file(p).values():
                touch(t)
                n += 1
    else:
        for t in lib.load_file(paths).values():
            touch(t)
            n += 1
elif mode == "ours_load_file_dir":
    for t in lib.load_file(paths[0]).values():
        touch(t)
        n += 1
elif mode in ("st_safe_open", "ours_safe_open"):
    for p in paths:
        with safe_open(p, framework="pt") as f:
            for k in f.keys():
                touch(f.get_tensor(k))
                n += 1
elif mode in ("st_ep", "ours_ep"):
    # vLLM's expert-parallel rule (ep_weight_filter): rank 0 of 8 keeps experts 0-31; another
    # expert's `.weight` is skipped, everything else kept.
    import os, re
    expert = re.compile(r"\.experts\.(\d+)\.")
    def keep(name):
        m = expert.search(name)
        return not (m and name.endswith(".weight") and int(m.group(1)) >= 32)
    index = paths[0]
    if mode == "ours_ep":
        for t in lib.load_file(index, select=keep).values():
            touch(t)
            n += 1
    else:
        # What vLLM's default loader does: every shard opened, its keys filtered.
        folder = os.path.dirname(index)
        files = sorted(set(json.load(open(index))["weight_map"].values()))
        kept = {}
        for file in files:
            with safe_open(os.path.join(folder, file), framework="pt") as f:
                for name in f.keys():
                    if keep(name):
                        kept[name] = f.get_tensor(name)
        for t in kept.values():
            touch(t)
            n += 1
elif mode in ("st_imports", "ours_imports"):
    pass  # the interpreter, torch and the library: what a process holds before any tensor
elif mode in ("st_select", "ours_select"):
    index, patterns = paths[0], paths[1:]
    import fnmatch, os
    if mode == "ours_select":
        for t in lib.load_file(index, select=patterns).values():
            touch(t)
            n += 1
    else:
        weight_map = json.load(open(index))["weight_map"]
        folder = os.path.dirname(index)
        by_file = {}
        for name, file in weight_map.items():
            if any(fnmatch.fnmatchcase(name, p) for p in patterns):
                by_file.setdefault(file, []).append(name)
        # Kept, as `load_file(select=)` keeps them (and as a caller keeps its weights), then
        # touched: dropping each after touching it let the kernel reclaim its pages (one
        # DeepSeek layer: 4.5 GB of RSS, against 11.6 GB kept), which is not the same work.
        kept = {}
        for file, names in by_file.items():
            with safe_open(os.path.join(folder, file), framework="pt") as f:
                for name in names:
                    kept[name] = f.get_tensor(name)
        for t in kept.values():
            touch(t)
            n += 1
print("DONE", time.monotonic(), n, flush=True)
"""


def write_file(path: Path, tensors: List[Tuple[str, str, List[int], int]], sparse: bool) -> None:
    """A safetensors file of `(name, dtype, shape, nbytes)`: its header, then the data (random
    bytes; a hole when `sparse`)."""
    header: Dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape, nbytes in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        if sparse:
            f.truncate(8 + len(text) + offset)
        else:
            f.write(os.urandom(offset))
    tmp.rename(path)


def write_index(folder: Path, weight_map: Dict[str, str], total: int) -> None:
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )


def small_checkpoint(work: Path, tensors: int, shards: int) -> Path:
    """`tensors` F32 tensors of 256 elements in `shards` files, with an index."""
    folder = work / f"small-{tensors}-{shards}"
    if (folder / "model.safetensors.index.json").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    per = -(-tensors // shards)
    weight_map: Dict[str, str] = {}
    for s in range(shards):
        names = [f"layers.{i}.weight" for i in range(s * per, min(tensors, (s + 1) * per))]
        if not names:
            break
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        write_file(folder / file, [(n, "F32", [ELEMENTS], 4 * ELEMENTS) for n in names], False)
        weight_map.update({n: file for n in names})
    write_index(folder, weight_map, 4 * ELEMENTS * tensors)
    return folder


def deepseek_tensors() -> List[Tuple[str, str, List[int], int]]:
    """DeepSeek-V3's tensors (its config: hidden 7168, 61 layers of which the first 3 dense,
    256 routed experts and one shared, MoE intermediate 2048, dense 18432, MLA ranks q 1536 and
    kv 512 with 128 heads of 128+64 / 128, vocab 129280; FP8 weights in 128x128 blocks with an
    F32 `weight_scale_inv` each; BF16 norms and embeddings)."""
    h, vocab, heads = 7168, 129280, 128
    out: List[Tuple[str, str, List[int], int]] = []

    def bf16(name: str, shape: List[int]) -> None:
        n = 1
        for d in shape:
            n *= d
        out.append((name, "BF16", shape, 2 * n))

    def fp8(name: str, rows: int, cols: int) -> None:
        out.append((f"{name}.weight", "F8_E4M3", [rows, cols], rows * cols))
        r, c = -(-rows // 128), -(-cols // 128)
        out.append((f"{name}.weight_scale_inv", "F32", [r, c], 4 * r * c))

    bf16("model.embed_tokens.weight", [vocab, h])
    for layer in range(61):
        p = f"model.layers.{layer}"
        bf16(f"{p}.input_layernorm.weight", [h])
        bf16(f"{p}.post_attention_layernorm.weight", [h])
        fp8(f"{p}.self_attn.q_a_proj", 1536, h)
        bf16(f"{p}.self_attn.q_a_layernorm.weight", [1536])
        fp8(f"{p}.self_attn.q_b_proj", heads * 192, 1536)
        fp8(f"{p}.self_attn.kv_a_proj_with_mqa", 512 + 64, h)
        bf16(f"{p}.self_attn.kv_a_layernorm.weight", [512])
        fp8(f"{p}.self_attn.kv_b_proj", heads * 256, 512)
        fp8(f"{p}.self_attn.o_proj", h, heads * 128)
        if layer < 3:
            for proj, rows, cols in (("gate", 18432, h), ("up", 18432, h), ("down", h, 18432)):
                fp8(f"{p}.mlp.{proj}_proj", rows, cols)
            continue
        bf16(f"{p}.mlp.gate.weight", [256, h])
        out.append((f"{p}.mlp.gate.e_score_correction_bias", "F32", [256], 4 * 256))
        for e in [f"experts.{i}" for i in range(256)] + ["shared_experts"]:
            for proj, rows, cols in (("gate", 2048, h), ("up", 2048, h), ("down", h, 2048)):
                fp8(f"{p}.mlp.{e}.{proj}_proj", rows, cols)
    bf16("model.norm.weight", [h])
    bf16("lm_head.weight", [vocab, h])
    return out


def deepseek_checkpoint(work: Path) -> Path:
    folder = work / "deepseek"
    if (folder / "model.safetensors.index.json").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    tensors = deepseek_tensors()
    total = sum(t[3] for t in tensors)
    shards, per_shard = 163, -(-total // 163)
    weight_map: Dict[str, str] = {}
    groups: List[List[Tuple[str, str, List[int], int]]] = [[]]
    filled = 0
    for t in tensors:
        if filled >= per_shard and len(groups) < shards:
            groups.append([])
            filled = 0
        groups[-1].append(t)
        filled += t[3]
    for i, group in enumerate(groups):
        file = f"model-{i + 1:05d}-of-{len(groups):06d}.safetensors"
        write_file(folder / file, group, sparse=True)
        weight_map.update({t[0]: file for t in group})
    write_index(folder, weight_map, total)
    print(
        f"wrote {folder}: {len(tensors)} tensors, {len(groups)} shards, {total / 1e9:.0f} GB "
        f"(sparse)",
        flush=True,
    )
    return folder


def warm(index: Path, patterns: List[str]) -> int:
    """Reads the selected tensors' bytes (a plain read into one reused buffer, untimed) so that
    every row starts with them in the page cache, whatever ran before it (`stage` holds one
    layer's 11 GB in memory of its own, which evicts the cache on a 24 GiB machine); returns the
    bytes the selection loads."""
    weight_map = json.loads(index.read_text())["weight_map"]
    files = sorted(
        {f for n, f in weight_map.items() if any(fnmatch.fnmatchcase(n, p) for p in patterns)}
    )
    buf = bytearray(16 << 20)
    total = 0
    for file in files:
        with open(index.parent / file, "rb", buffering=0) as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
            for name, info in header.items():
                if name == "__metadata__" or not any(
                    fnmatch.fnmatchcase(name, p) for p in patterns
                ):
                    continue
                start, end = (8 + n + o for o in info["data_offsets"])
                fh.seek(start)
                while start < end:
                    got = fh.readinto(memoryview(buf)[: min(end - start, len(buf))])
                    if not got:
                        raise OSError(f"{file} ends before byte {end}")
                    start += got
                total += end - 8 - n - info["data_offsets"][0]
    return total


def deepseek_tiny_checkpoint(work: Path) -> Path:
    """DeepSeek-V3's 90,000 tensor names and dtypes in 163 shards, every tensor tiny (a matrix
    [8, 16], a vector [16]) and its bytes random: what a selection costs per tensor and per
    shard at that width, the bytes aside."""
    folder = work / "deepseek-tiny"
    if (folder / "model.safetensors.index.json").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    width = {"F8_E4M3": 1, "BF16": 2, "F32": 4}
    tensors = []
    for name, dtype, shape, _ in deepseek_tensors():
        tiny = [8, 16] if len(shape) == 2 else [16]
        tensors.append((name, dtype, tiny, width[dtype] * (128 if len(shape) == 2 else 16)))
    per = -(-len(tensors) // 163)
    weight_map: Dict[str, str] = {}
    for i in range(163):
        group = tensors[i * per : (i + 1) * per]
        file = f"model-{i + 1:05d}-of-000163.safetensors"
        write_file(folder / file, group, sparse=False)
        weight_map.update({t[0]: file for t in group})
    write_index(folder, weight_map, sum(t[3] for t in tensors))
    return folder


def shards_of(folder: Path) -> List[str]:
    return sorted(str(p) for p in folder.glob("*.safetensors"))


def run(args: argparse.Namespace, argv: List[str], stage: bool = False) -> dict:
    """One sample in a fresh process: seconds whole and after imports, tensors, and the peak RSS
    of that process alone (`wait4`'s)."""
    t0 = time.monotonic()
    cmd = argv if stage else [args.python, "-c", CHILD, *argv]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        child = subprocess.Popen(cmd, stdout=out, stderr=err)
        _, code, usage = os.wait4(child.pid, 0)
        seconds = time.monotonic() - t0
        child.returncode = os.waitstatus_to_exitcode(code)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if child.returncode:
        return {"error": (stderr.strip().splitlines() or ["?"])[-1][:200]}
    if stage:
        report = json.loads(stdout)
        return {"seconds": seconds, "tensors": report.get("tensors"), "maxrss_kib": usage.ru_maxrss}
    marks = {
        ln.split()[0]: ln.split()[1:] for ln in stdout.splitlines() if ln[:4] in ("IMPO", "DONE")
    }
    done = float(marks["DONE"][0])
    return {
        "seconds": done - t0,
        "after_imports": done - float(marks["IMPORTED"][0]),
        "tensors": int(marks["DONE"][1]),
        "maxrss_kib": usage.ru_maxrss,
    }


def status(sample: dict) -> str:
    if "error" in sample:
        return f"failed: {sample['error']}"
    return f"{sample['seconds']:.3f} s"


def median(samples: List[dict], key: str) -> Optional[float]:
    xs = [s[key] for s in samples if key in s]
    return statistics.median(xs) if xs else None


def main() -> int:
    if sys.argv[1:2] == ["--warm"]:
        print(warm(Path(sys.argv[2]), sys.argv[3:]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "bench_scale")
    ap.add_argument("--tensors", default="1000,10000,60000,200000")
    ap.add_argument("--shards", default="1,10,60,500,2000")
    ap.add_argument("--no-deepseek", action="store_true")
    ap.add_argument("--stage", default="target/release/stage")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--plot", type=Path, default=None)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)

    # (sweep, x, checkpoint folder)
    cases: List[Tuple[str, int, Path]] = []
    for n in (int(x) for x in args.tensors.split(",") if x):
        cases.append(("tensors", n, small_checkpoint(args.work, n, 60)))
    for s in (int(x) for x in args.shards.split(",") if x):
        cases.append(("shards", s, small_checkpoint(args.work, 60000, s)))
    rows = {
        "st load_file": ("st_load_file", "shards"),
        "ours load_file(shards)": ("ours_load_file_shards", "shards"),
        "ours load_file(directory)": ("ours_load_file_dir", "dir"),
        "st safe_open": ("st_safe_open", "shards"),
        "ours safe_open": ("ours_safe_open", "shards"),
    }
    deepseek = None if args.no_deepseek else deepseek_checkpoint(args.work)
    tiny = None if args.no_deepseek else deepseek_tiny_checkpoint(args.work)
    layer = "model.layers.10"
    selections = {
        "one 14 KB tensor": [f"{layer}.input_layernorm.weight"],
        "one layer": [f"{layer}.*"],
        "eight experts": [f"{layer}.mlp.experts.{i}.*" for i in range(8)],
    }
    samples: List[dict] = []
    print(f"# bench_scale: rounds {args.rounds}, {os.cpu_count()} CPUs", flush=True)
    for rnd in range(args.rounds):
        for sweep, x, folder in cases:
            order = list(rows.items())
            order = order[rnd % len(order) :] + order[: rnd % len(order)]
            for row, (mode, what) in order:
                paths = [str(folder)] if what == "dir" else shards_of(folder)
                s = run(args, [mode, *paths])
                s.update(sweep=sweep, x=x, row=row, round=rnd)
                samples.append(s)
                print(f"  {sweep}={x} {row}: {status(s)}", flush=True)
        if deepseek is not None:
            index = str(deepseek / "model.safetensors.index.json")
            for mode in ("ours_imports", "st_imports"):
                s = run(args, [mode])
                s.update(sweep="imports", x=mode, row=mode, round=rnd)
                samples.append(s)
            tiny_index = str(tiny / "model.safetensors.index.json")
            ep = [
                ("ours load_file(select=vLLM's filter)", "ours_ep"),
                ("st safe_open of every shard, vLLM's filter", "st_ep"),
            ]
            for row, mode in ep if rnd % 2 == 0 else ep[::-1]:
                s = run(args, [mode, tiny_index])
                what = "expert-parallel rank 0 of 8 (tiny tensors)"
                s.update(sweep="deepseek", x=what, row=row, round=rnd)
                samples.append(s)
                print(f"  deepseek-tiny {row}: {status(s)}", flush=True)
            for what, patterns in selections.items():
                cmds = [
                    (
                        "stage --select",
                        [args.stage, index, "--backend", "host", "--json"]
                        + [a for p in patterns for a in ("--select", p)],
                        True,
                    ),
                    ("ours load_file(select=)", ["ours_select", index, *patterns], False),
                    ("st safe_open of the shards", ["st_select", index, *patterns], False),
                ]
                # Each order of the rows once in six rounds (the process after `stage` starts
                # while the kernel takes back its 11 GB), each row started with the selection's
                # bytes in the page cache and a second's pause after reading them.
                cmds = [cmds[i] for i in list(itertools.permutations(range(len(cmds))))[rnd % 6]]
                for row, argv, is_stage in cmds:
                    # In a process of its own: one made by this one starts with its memory, and
                    # `wait4`'s peak RSS of a small one (`stage`) counted the index parsed here.
                    loaded = int(
                        subprocess.run(
                            [sys.executable, __file__, "--warm", index, *patterns],
                            capture_output=True,
                            text=True,
                            check=True,
                        ).stdout
                    )
                    time.sleep(1.0)
                    s = run(args, argv, stage=is_stage)
                    s.update(sweep="deepseek", x=what, row=row, round=rnd, bytes=loaded)
                    samples.append(s)
                    print(f"  deepseek {what} {row}: {status(s)}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(samples, indent=1))
    print(report(samples))
    if args.plot:
        plot(samples, args.plot)
    return 0


def report(samples: List[dict]) -> str:
    out = []
    for sweep, label in (("tensors", "tensors (60 shards)"), ("shards", "shards (60,000 tensors)")):
        xs = sorted({s["x"] for s in samples if s["sweep"] == sweep})
        if not xs:
            continue
        rows = list(dict.fromkeys(s["row"] for s in samples if s["sweep"] == sweep))
        out.append(f"\n### Seconds by {label}, whole process (after imports)\n")
        out.append("| row | " + " | ".join(f"{x:,}" for x in xs) + " |")
        out.append("|---|" + "---:|" * len(xs))
        for row in rows:
            cells = []
            for x in xs:
                ss = [s for s in samples if s["sweep"] == sweep and s["x"] == x and s["row"] == row]
                whole, after = median(ss, "seconds"), median(ss, "after_imports")
                cells.append("failed" if whole is None else f"{whole:.2f} ({after:.3f})")
            out.append(f"| {row} | " + " | ".join(cells) + " |")
        for ours, theirs in (
            ("ours load_file(shards)", "st load_file"),
            ("ours load_file(directory)", "st load_file"),
            ("ours safe_open", "st safe_open"),
        ):
            cells = []
            for x in xs:
                a = median(
                    [
                        s
                        for s in samples
                        if s["sweep"] == sweep and s["x"] == x and s["row"] == ours
                    ],
                    "after_imports",
                )
                b = median(
                    [
                        s
                        for s in samples
                        if s["sweep"] == sweep and s["x"] == x and s["row"] == theirs
                    ],
                    "after_imports",
                )
                cells.append(f"{b / a:.2f}x" if a and b else "")
            out.append(f"| speed of {ours} / {theirs}, after imports | " + " | ".join(cells) + " |")
    ds = [s for s in samples if s["sweep"] == "deepseek"]
    if ds:
        out.append(
            "\n### The sparse DeepSeek-V3-shaped checkpoint: seconds whole process, peak RSS\n"
        )
        base = {
            mode: median(
                [s for s in samples if s["sweep"] == "imports" and s["x"] == mode], "maxrss_kib"
            )
            for mode in ("ours_imports", "st_imports")
        }
        out.append(
            f"(peak RSS of a process that only imports torch and the library: ours "
            f"{(base['ours_imports'] or 0) / 1024:.0f} MiB, `safetensors` "
            f"{(base['st_imports'] or 0) / 1024:.0f} MiB; `over` is the peak RSS less the bytes "
            f"loaded and less that)\n"
        )
        out.append(
            "| selection | row | median s | min-max s | after imports s | tensors | MiB loaded "
            "| peak RSS MiB | over MiB |"
        )
        out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for what in dict.fromkeys(s["x"] for s in ds):
            for row in dict.fromkeys(s["row"] for s in ds if s["x"] == what):
                ss = [s for s in ds if s["x"] == what and s["row"] == row and "seconds" in s]
                if not ss:
                    out.append(f"| {what} | {row} | failed | | | |")
                    continue
                xs = [s["seconds"] for s in ss]
                rss = max(s["maxrss_kib"] for s in ss) * 1024
                loaded = ss[0].get("bytes")
                imports = 0.0
                if not row.startswith("stage"):
                    imports = base["st_imports" if row.startswith("st ") else "ours_imports"] or 0
                shown, over = "", ""
                if loaded is not None:
                    shown = f"{loaded / 2**20:.0f}"
                    over = f"{(rss - loaded - imports * 1024) / 2**20:.0f}"
                after = [s["after_imports"] for s in ss if "after_imports" in s]
                after_shown = f"{statistics.median(after):.3f}" if after else ""
                out.append(
                    f"| {what} | {row} | {statistics.median(xs):.3f} | {min(xs):.3f}-{max(xs):.3f} | "
                    f"{after_shown} | {ss[0].get('tensors')} | {shown} | {rss / 2**20:.0f} | "
                    f"{over} |"
                )
    return "\n".join(out)


def plot(samples: List[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not importable: no plot written to {path}")
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, sweep, label in zip(
        axes, ("tensors", "shards"), ("tensors (60 shards)", "shards (60,000 tensors)")
    ):
        for row in dict.fromkeys(s["row"] for s in samples if s["sweep"] == sweep):
            xs = sorted({s["x"] for s in samples if s["sweep"] == sweep})
            ys = [
                median(
                    [s for s in samples if s["sweep"] == sweep and s["x"] == x and s["row"] == row],
                    "after_imports",
                )
                for x in xs
            ]
            ax.plot(xs, ys, marker="o", label=row, linestyle="--" if row.startswith("st ") else "-")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("seconds after imports (median)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot written to {path}")


if __name__ == "__main__":
    sys.exit(main())
