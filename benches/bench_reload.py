#!/usr/bin/env python3
"""Reloading weights into a model that already holds them: `safetensors_staging.torch.load_into`
against the ways people do it today, on the same model and checkpoint, in one run.

Rows (each reload in a fresh process: the model is built from its first checkpoint by
`transformers`' own `from_pretrained`, then the second checkpoint, one training step away, is
reloaded into it; rounds interleaved; the page cache warm):

- `load_into`: `safetensors_staging.torch.load_into(model, DIR)`, in place;
- `load_file+load_state_dict`: `model.load_state_dict(safetensors.torch.load_file(f),
  strict=False)` for each shard (what vLLM-style reload loops and most RL stacks do);
- `safetensors.load_model`: `safetensors.torch.load_model(model, f, strict=False)` for each
  shard (`safetensors`' own helper).

The model's weights are first copied into memory of its own (as a model being trained holds
them: `from_pretrained` may leave CPU weights as copy-on-write pages of the file's mapping, which
any write in place copies). For each: the seconds of the reload call, and the memory above the
model's own while it ran:
on the CPU, the process's peak RSS (`VmHWM`, reset through `/proc/self/clear_refs` just before)
less its RSS just before; on a GPU (`--device cuda:0`), `torch.cuda.max_memory_allocated()`
(reset just before) less the memory allocated before. Every row checks that the reloaded
weights equal the second checkpoint's, bit for bit.

Usage:

    python benches/bench_reload.py WORK_DIR [--sizes 0.4,1.5] [--rounds 5] [--device cpu]

WORK_DIR receives, per size, a Qwen2-architecture model with random BF16 weights (made by
`transformers` from a config: no download) saved in 500 MB shards, and the same model after one
SGD step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

from bench_python import warm_page_cache  # benches/, on the path when run as a script

SHAPES = {
    # GB (BF16): hidden, intermediate, layers, vocab
    0.4: (1024, 2816, 12, 32000),
    1.5: (2048, 5632, 12, 32000),
}

CHILD = r"""
import json, sys, time, torch
from pathlib import Path
import transformers
first, second, how, device = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
model = transformers.AutoModelForCausalLM.from_pretrained(first, dtype=torch.bfloat16).to(device)
# Weights in memory of the model's own, as a model being trained holds them (from_pretrained may
# leave CPU weights as copy-on-write pages of the file's mapping, which any write copies).
with torch.no_grad():
    for tensor in list(model.parameters()) + list(model.buffers()):
        tensor.data = tensor.data.clone()
shards = sorted(second.glob("*.safetensors"))
def rss():
    fields = dict(l.split(":", 1) for l in open("/proc/self/status"))
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024
import gc; gc.collect()
if how == "load_into":
    import safetensors_staging.torch as stt
    stt.load_into  # imported before the measure
else:
    import safetensors.torch
if device.startswith("cuda"):
    torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak RSS starts again from the RSS now
before, _ = rss()
start = time.perf_counter()
if how == "load_into":
    stt.load_into(model, second)
elif how == "load_file+load_state_dict":
    for shard in shards:
        model.load_state_dict(safetensors.torch.load_file(shard, device=device), strict=False)
else:
    for shard in shards:
        safetensors.torch.load_model(model, shard, strict=False, device=device)
if device.startswith("cuda"):
    torch.cuda.synchronize()
seconds = time.perf_counter() - start
_, peak = rss()
extra_device = torch.cuda.max_memory_allocated() - base if device.startswith("cuda") else 0
# Bit for bit the second checkpoint's weights (tied lm_head included through embed_tokens).
state = model.state_dict()
import safetensors
for shard in shards:
    with safetensors.safe_open(shard, framework="pt") as f:
        for name in f.keys():
            if not torch.equal(state[name].cpu(), f.get_tensor(name)):
                raise SystemExit(f"{how}: {name} differs from the checkpoint")
print(json.dumps({"seconds": seconds, "extra_rss": peak - before, "extra_device": extra_device}))
"""


def make_models(work: Path, size: float) -> Path:
    """`work/size` (the model) and `work/size-step1` (one SGD step later)."""
    import torch
    import transformers

    base = work / f"{size}"
    if (base / "config.json").exists() and (work / f"{size}-step1" / "config.json").exists():
        return base
    hidden, intermediate, layers, vocab = SHAPES[size]
    config = transformers.Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 128,
        num_key_value_heads=max(hidden // 512, 1),
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(base, max_shard_size="500MB")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 1e-3)  # a step's worth of change, in every weight
    model.save_pretrained(work / f"{size}-step1", max_shard_size="500MB")
    return base


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", type=Path)
    parser.add_argument("--sizes", default="0.4,1.5")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    hows = ["load_into", "load_file+load_state_dict", "safetensors.load_model"]
    results: Dict[tuple, List[dict]] = {}
    sizes = [float(s) for s in args.sizes.split(",")]
    for size in sizes:
        make_models(args.work, size)
        # The page cache warm from the first row on (else the first reload of each size reads
        # the disk: 0.7 s and 2.6 s for one row of each, 2026-12-04).
        warm_page_cache(args.work / f"{size}")
        warm_page_cache(args.work / f"{size}-step1")
    for r in range(args.rounds):
        for size in sizes:
            first, second = args.work / f"{size}", args.work / f"{size}-step1"
            for how in hows:
                out = subprocess.run(
                    [sys.executable, "-c", CHILD, str(first), str(second), how, args.device],
                    capture_output=True,
                    text=True,
                )
                if out.returncode != 0:
                    print(f"round {r} {size} {how}: FAILED {out.stderr[-600:]}", file=sys.stderr)
                    continue
                row = json.loads(out.stdout.strip().splitlines()[-1])
                results.setdefault((size, how), []).append(row)
                print(f"round {r} {size} GB {how}: {row}", file=sys.stderr)
    unit = "device MiB above the model" if args.device != "cpu" else "peak RSS MiB above the model"
    print(f"| model GB | reload | s (median) | spread (s) | x baseline | {unit} (median) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for size in sizes:
        base_rows = results.get((size, "load_file+load_state_dict"), [])
        base = statistics.median(r["seconds"] for r in base_rows) if base_rows else None
        for how in hows:
            rows = results.get((size, how), [])
            if not rows:
                continue
            secs = [r["seconds"] for r in rows]
            med = statistics.median(secs)
            key = "extra_device" if args.device != "cpu" else "extra_rss"
            mem = statistics.median(r[key] for r in rows) / 2**20
            ratio = f"{base / med:.2f}" if base and how != "load_file+load_state_dict" else ""
            print(
                f"| {size} | `{how}` | {med:.3f} | {min(secs):.3f}-{max(secs):.3f} | {ratio} "
                f"| {mem:.0f} |"
            )


if __name__ == "__main__":
    main()
