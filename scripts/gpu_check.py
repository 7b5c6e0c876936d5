#!/usr/bin/env python3
"""GPU check for the cuFile backend: one command on a CUDA machine, one table at the end.

usage: gpu_check.py --stage PATH [--size-gib 8] [--dir /dev/shm/staging-gpu-check] [--out DIR]
                    [--dry-run]

Length: one file on purpose. The GPU machine has no network and a budget of minutes; this script
is carried there alone, with the child scripts it runs kept as text beside the steps they serve.

1. Writes a Qwen-like bf16 checkpoint (shards + index) of --size-gib with PyTorch and
   safetensors (falls back to `stage --keep-synthetic` when torch is missing).
2. Finds libcufile.so.0 in the nvidia-cufile Python package (or $STAGING_CUFILE_LIB).
3. For each cuFile mode (auto, compat, gds, posix): a timed run of
   `stage --backend cufile --json`, then a `--checksums` run whose every SHA-256 is compared with
   the bytes Python's safetensors reads.
4. Times safetensors.torch.load_file(shard, device="cuda:0") over the same shards in the same run
   (and fastsafetensors when it is installed).
5. Forces the low-memory path with a budget (--device-memory) and checks bytes there too.
6. The Python package (`safetensors_staging`, its abi3 wheel carried over and installed by
   gpu-check.sh): `load_file(dir, device="cuda:0")` timed, its bytes compared on the device with
   `safetensors.torch.load_file(shard, device="cuda:0")`, peak device memory and RSS; the same
   under a budget; the MiniLM architecture (config and tokenizer carried; weights seeded and
   written there, the real 91 MB ones exceed the carry limit) embedding sentences on cuda:0 from
   weights this package loaded, against transformers' own CPU load of the same file.
7. A torch.distributed group of one (NCCL on the GPU, gloo in a dry run) through
   `load_file(..., process_group=...)`, bytes compared: a smoke test of the many-ranks path
   (one GPU: multi-GPU exchange is not run).
8. The caller's context: `torch.cuda.current_device()` and `cuCtxGetCurrent` are the same
   after `load_file` and after freeing its tensors; then, with a context of the caller's own
   (`cuCtxCreate`) current, still that one after a load and its close. And destinations
   created and filled on a busy side stream (the current stream during the load): the load's
   bytes, not the fill, are what they hold after (the library waits for that stream).
9. The Rust API with a cudarc stream of the caller's own (`examples/callers_stream.rs`, carried):
   two loads through one prepared backend, POSIX and auto modes, bytes compared.
10. The physical limit: a pinned host tensor of the checkpoint's size copied to cuda:0 (GB/s);
   every row shows its ratio to it. fastsafetensors (its wheel carried over), when importable,
   is a row of its own.
11. `hf://`: the test suites' stand-in Hugging Face Hub (backend-mock's `fake_hub` example,
   carried) serves the checkpoint on loopback; `stage hf://gpu/ckpt` from an empty
   Hugging Face cache (streamed onto the device through pinned bounce buffers while the cache
   is written and each shard's SHA-256 checked), its checksums from the cache, then a warm load.
Peak host RSS comes from wait4() of each child; peak device memory from nvidia-smi sampling
(minus the idle baseline) and from stage's own report. Everything lands in --out as JSON + a
Markdown table.

--dry-run runs the same orchestration without a GPU (stub libraries via the environment, no
torch): it checks the script, not the hardware.
"""

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time

GIB = 1 << 30


def log(*args):
    print(*args, file=sys.stderr, flush=True)


class GpuMemorySampler:
    """Polls nvidia-smi for used memory on GPU 0; reports the peak above the starting value."""

    def __init__(self, enabled):
        self.enabled = enabled and shutil.which("nvidia-smi") is not None
        self.peak = 0
        self.base = 0
        self._stop = threading.Event()

    def _used_mib(self):
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
            capture_output=True,
            text=True,
            check=False,
        )
        try:
            return int(out.stdout.strip().splitlines()[0])
        except (ValueError, IndexError):
            return 0

    def __enter__(self):
        if self.enabled:
            self.base = self._used_mib()
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self._used_mib())
            time.sleep(0.05)

    def __exit__(self, *exc):
        if self.enabled:
            self._stop.set()
            self._thread.join()

    def delta_mib(self):
        return max(0, self.peak - self.base) if self.enabled else None


def run_child(cmd, env=None, gpu=False):
    """Runs cmd; returns (returncode, stdout, stderr, seconds, peak_rss_mib, gpu_delta_mib)."""
    start = time.perf_counter()
    with GpuMemorySampler(gpu) as sampler:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        out_chunks, err_chunks = [], []
        t_out = threading.Thread(target=lambda: out_chunks.append(proc.stdout.read()))
        t_err = threading.Thread(target=lambda: err_chunks.append(proc.stderr.read()))
        t_out.start()
        t_err.start()
        _, status, usage = os.wait4(proc.pid, 0)
        t_out.join()
        t_err.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - start
    return (
        proc.returncode,
        out_chunks[0].decode(),
        err_chunks[0].decode(),
        seconds,
        usage.ru_maxrss / 1024,
        sampler.delta_mib(),
    )


def find_libcufile():
    if os.environ.get("STAGING_CUFILE_LIB"):
        return os.environ["STAGING_CUFILE_LIB"]
    try:
        import nvidia  # noqa: F401  (namespace package of the NVIDIA wheels)

        roots = list(getattr(sys.modules["nvidia"], "__path__", []))
    except ImportError:
        roots = []
    for root in roots:
        for dirpath, _, files in os.walk(root):
            if "libcufile.so.0" in files:
                return os.path.join(dirpath, "libcufile.so.0")
    return None


def qwen_like_shapes(size_bytes):
    hidden, inter, kv, vocab = 3584, 18944, 512, 152064  # Qwen2-7B
    tensors = [("model.embed_tokens.weight", (vocab, hidden))]

    def layer(i):
        return [
            (f"model.layers.{i}.input_layernorm.weight", (hidden,)),
            (f"model.layers.{i}.self_attn.q_proj.weight", (hidden, hidden)),
            (f"model.layers.{i}.self_attn.q_proj.bias", (hidden,)),
            (f"model.layers.{i}.self_attn.k_proj.weight", (kv, hidden)),
            (f"model.layers.{i}.self_attn.k_proj.bias", (kv,)),
            (f"model.layers.{i}.self_attn.v_proj.weight", (kv, hidden)),
            (f"model.layers.{i}.self_attn.v_proj.bias", (kv,)),
            (f"model.layers.{i}.self_attn.o_proj.weight", (hidden, hidden)),
            (f"model.layers.{i}.post_attention_layernorm.weight", (hidden,)),
            (f"model.layers.{i}.mlp.gate_proj.weight", (inter, hidden)),
            (f"model.layers.{i}.mlp.up_proj.weight", (inter, hidden)),
            (f"model.layers.{i}.mlp.down_proj.weight", (hidden, inter)),
        ]

    def nbytes(shape):
        return 2 * eval("*".join(map(str, shape)))

    total, i = nbytes(tensors[0][1]), 0
    while total < size_bytes:
        for t in layer(i):
            tensors.append(t)
            total += nbytes(t[1])
        i += 1
    tensors.append(("model.norm.weight", (hidden,)))
    return tensors, nbytes


def write_checkpoint_torch(directory, size_bytes):
    import torch
    from safetensors.torch import save_file

    tensors, nbytes = qwen_like_shapes(size_bytes)
    shards, current, current_bytes = [], [], 0
    for name, shape in tensors:
        if current and current_bytes + nbytes(shape) > 2 * GIB:
            shards.append(current)
            current, current_bytes = [], 0
        current.append((name, shape))
        current_bytes += nbytes(shape)
    shards.append(current)
    weight_map = {}
    gen = torch.Generator(device="cuda").manual_seed(0)
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        data = {
            name: torch.randn(shape, dtype=torch.bfloat16, device="cuda", generator=gen).cpu()
            for name, shape in shard
        }
        save_file(data, os.path.join(directory, fname), metadata={"format": "pt"})
        weight_map.update({name: fname for name, _ in shard})
        del data
    total = sum(nbytes(s) for _, s in tensors)
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    return [
        os.path.join(directory, f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors")
        for i in range(len(shards))
    ]


def reference_hashes(files):
    from safetensors import deserialize

    hashes = {}
    for file in files:
        with open(file, "rb") as f:
            for name, info in deserialize(f.read()):
                hashes[name] = hashlib.sha256(bytes(info["data"])).hexdigest()
    return hashes


PY_LOAD = r"""
import glob, json, os, sys, time
import torch
import safetensors_staging as st
from safetensors.torch import load_file
path, device, cap = sys.argv[1], sys.argv[2], sys.argv[3]
cuda = device.startswith("cuda")
if cuda:
    torch.cuda.init(); torch.zeros(1, device=device); torch.cuda.synchronize()
    free0 = torch.cuda.mem_get_info()[0]
t = time.perf_counter()
with st.stage(path, device, memory_cap=int(cap) if cap != "none" else None) as it:
    out = dict(it)
if cuda:
    torch.cuda.synchronize()
seconds = time.perf_counter() - t
used = (free0 - torch.cuda.mem_get_info()[0]) if cuda else 0
report = it.report()
bad = 0
for f in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
    for name, want in load_file(f, device=device).items():
        got = out[name].to(want.device)
        if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(
                got.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)):
            bad += 1
print(json.dumps({"seconds": seconds, "device_used": used, "bad": bad, "tensors": len(out),
                  "devices": sorted({str(v.device) for v in out.values()}),
                  "report": {k: report[k] for k in ("backend", "mode", "paths", "fallbacks", "peak_device_bytes",
                                                    "peak_host_bytes", "bytes_read", "read_requests")}}))
"""

GROUP_OF_ONE = r"""
import datetime, glob, json, os, sys, tempfile, time
import torch, torch.distributed as dist
import safetensors_staging as st
from safetensors.torch import load_file
path, device = sys.argv[1], sys.argv[2]
backend = "nccl" if device.startswith("cuda") else "gloo"
if backend == "nccl":
    torch.cuda.set_device(device)
rdzv = os.path.join(tempfile.mkdtemp(), "rendezvous")
dist.init_process_group(backend, init_method=f"file://{rdzv}", rank=0, world_size=1,
                        timeout=datetime.timedelta(seconds=120))
t = time.perf_counter()
with st.stage(path, device, process_group=dist.group.WORLD) as it:
    out = dict(it)
    report = it.report()
if device.startswith("cuda"):
    torch.cuda.synchronize()
seconds = time.perf_counter() - t
bad = 0
for f in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
    for name, want in load_file(f, device=device).items():
        got = out[name]
        if got.dtype != want.dtype or got.shape != want.shape or not torch.equal(
                got.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)):
            bad += 1
dist.destroy_process_group()
print(json.dumps({"seconds": seconds, "bad": bad, "backend": backend, "bytes_read": report["bytes_read"],
                  "bytes_received": report["bytes_received"], "devices": sorted({str(v.device) for v in out.values()})}))
"""

# The drop-in: `safe_open(device=...)` + `get_tensor` of every key in file order, ours against
# safetensors' (which copies through host memory), bytes compared on the device, and a slice.
SAFE_OPEN = r"""
import glob, json, os, sys, time, torch, safetensors
import safetensors_staging as st
path, device, which = sys.argv[1], sys.argv[2], sys.argv[3]
files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
torch.empty(1, device=device)
out, backend, bytes_read = {}, None, None
t = time.perf_counter()
if which == "staging":
    with st.safe_open(path, framework="pt", device=device) as h:
        for k in h.offset_keys():
            out[k] = h.get_tensor(k)
        backend, bytes_read = h.backend, h.bytes_read
        first = h.offset_keys()[0]
        n = h.get_slice(first).get_shape()[0]
        part = h.get_slice(first)[n // 4 : n // 2]
else:
    for f in files:
        with safetensors.safe_open(f, framework="pt", device=device) as h:
            for k in h.offset_keys():
                out[k] = h.get_tensor(k)
if device.startswith("cuda"):
    torch.cuda.synchronize()
seconds = time.perf_counter() - t
bad = 0
if which == "staging":
    for f in files:
        with safetensors.safe_open(f, framework="pt", device=device) as h:
            for k in h.offset_keys():
                want, got = h.get_tensor(k), out[k]
                if got.dtype != want.dtype or got.shape != want.shape or got.device != want.device or not torch.equal(
                        got.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)):
                    bad += 1
            if first in h.keys():
                n = h.get_slice(first).get_shape()[0]
                bad += 0 if torch.equal(part.view(torch.uint8), h.get_slice(first)[n // 4 : n // 2].view(torch.uint8)) else 1
print(json.dumps({"seconds": seconds, "bad": bad, "backend": backend, "bytes_read": bytes_read,
                  "devices": sorted({str(v.device) for v in out.values()})}))
"""

# safetensors_staging.transformers.from_pretrained of a small Qwen2 (random weights, saved
# sharded here) onto the GPU, against the same on the CPU: weights bit-equal, logits close.
QWEN = r"""
import json, sys, torch, transformers
from safetensors_staging.transformers import from_pretrained
work, device = sys.argv[1], sys.argv[2]
config = transformers.Qwen2Config(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                                  num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=False)
torch.manual_seed(7)
transformers.Qwen2ForCausalLM(config).save_pretrained(work, max_shard_size="2MB")
cpu = from_pretrained(work, transformers.AutoModelForCausalLM).eval()
gpu = from_pretrained(work, transformers.AutoModelForCausalLM, device=device).eval()
same = all(torch.equal(a.cpu(), b) for a, b in zip(gpu.state_dict().values(), cpu.state_dict().values()))
prompt = torch.tensor([[1, 17, 42, 99, 3, 250]])
with torch.no_grad():
    diff = (gpu(prompt.to(device)).logits.cpu() - cpu(prompt).logits).abs().max()
print(json.dumps({"same_weights": same, "max_abs_diff": float(diff),
                  "devices": sorted({str(p.device) for p in gpu.parameters()})}))
"""

RELOAD = r"""
import json, sys, time, torch, transformers
from pathlib import Path
from safetensors_staging.torch import load_into
work, device = Path(sys.argv[1]), sys.argv[2]
config = transformers.Qwen2Config(vocab_size=4096, hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                                  num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=False)
torch.manual_seed(11)
model = transformers.Qwen2ForCausalLM(config).to(torch.bfloat16)
model.save_pretrained(work / "step0", max_shard_size="20MB")
with torch.no_grad():  # one "training step": every weight changes
    for p in model.parameters():
        p.add_(torch.randn_like(p) * 0.01)
model.save_pretrained(work / "step1", max_shard_size="20MB")
want = {k: v.clone() for k, v in model.state_dict().items()}
model = transformers.AutoModelForCausalLM.from_pretrained(work / "step0", dtype=torch.bfloat16).to(device)
memory = {name: p.data_ptr() for name, p in model.named_parameters()}
model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
base = torch.cuda.memory_allocated()
start = time.perf_counter()
result = load_into(model, work / "step1")
torch.cuda.synchronize()
seconds = time.perf_counter() - start
extra = torch.cuda.max_memory_allocated() - base
state = model.state_dict()
same = all(torch.equal(state[k].cpu(), want[k]) for k in want)
in_place = all(p.data_ptr() == memory[n] for n, p in model.named_parameters())
print(json.dumps({"same": same, "in_place": in_place, "extra_device_mib": extra / 2**20,
                  "model_mib": model_bytes / 2**20, "seconds": seconds,
                  "paths": {k: v["tensors"] for k, v in result.report["paths"].items()},
                  "mode": result.report["mode"]}))
"""

PINNED = r"""
import json, sys, time, torch
n = int(sys.argv[1])
host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
host.fill_(1)
dev = torch.empty(n, dtype=torch.uint8, device="cuda:0")
torch.cuda.synchronize()
best = 0.0
for _ in range(3):
    t = time.perf_counter(); dev.copy_(host, non_blocking=True); torch.cuda.synchronize()
    best = max(best, n / (time.perf_counter() - t))
print(json.dumps({"bytes_per_second": best}))
"""

FASTSAFETENSORS = r"""
import json, sys, time, torch
from fastsafetensors import fastsafe_open
files = sys.argv[1:]
torch.cuda.init(); torch.zeros(1, device="cuda:0"); torch.cuda.synchronize()
free0 = torch.cuda.mem_get_info()[0]
t = time.perf_counter()
with fastsafe_open(filenames=files, nogds=True, device="cuda:0") as f:
    kept = [f.get_tensor(k) for k in f.get_keys()]
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t
    used = free0 - torch.cuda.mem_get_info()[0]
print(json.dumps({"seconds": seconds, "device_used": used, "tensors": len(kept)}))
"""

MINILM = r"""
import json, os, sys
import torch
os.environ["HF_HUB_OFFLINE"] = "1"
from transformers import AutoConfig, AutoModel, AutoTokenizer
import safetensors_staging as st
src, work, device = sys.argv[1], sys.argv[2], sys.argv[3]
torch.manual_seed(0)
config = AutoConfig.from_pretrained(src)
seeded = AutoModel.from_config(config)
seeded.save_pretrained(work, safe_serialization=True)
tokenizer = AutoTokenizer.from_pretrained(src)
sentences = ["Safetensors checkpoints load onto the device in bounded memory.",
             "The quick brown fox jumps over the lazy dog."]
def embed(model, dev):
    batch = tokenizer(sentences, padding=True, return_tensors="pt").to(dev)
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    return torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=1).cpu()
cpu = embed(AutoModel.from_pretrained(work).eval(), "cpu")
model = AutoModel.from_config(config).to(device).eval()
weights = st.load_file(work, device)
model.load_state_dict(weights, strict=False)
gpu = embed(model, device)
same_weights = all(torch.equal(weights[k].cpu(), v) for k, v in seeded.state_dict().items() if k in weights)
print(json.dumps({"max_abs_diff": float((gpu - cpu).abs().max()), "same_weights": same_weights,
                  "devices": sorted({str(v.device) for v in weights.values()})}))
"""

CONTEXT = r"""
import ctypes, gc, json, sys
import torch
import safetensors_staging as st
path, device = sys.argv[1], sys.argv[2]
cuda = ctypes.CDLL("libcuda.so.1")
def current():
    c = ctypes.c_void_p()
    cuda.cuCtxGetCurrent(ctypes.byref(c))
    return c.value
def state():
    return [torch.cuda.current_device(), current()]
torch.cuda.set_device(device); torch.zeros(1, device=device); torch.cuda.synchronize()
seen = {"torch's context, before": state()}
weights = st.load_file(path, device)
seen["after load_file"] = state()
del weights; gc.collect(); torch.cuda.synchronize()
seen["after freeing its tensors"] = state()
# A context of the caller's own on the same device, current: the library must push and pop its
# primary context around every call, never replace the caller's.
index = torch.cuda.current_device()
dev, mine = ctypes.c_int(), ctypes.c_void_p()
cuda.cuDeviceGet(ctypes.byref(dev), index)
rc = cuda.cuCtxCreate_v2(ctypes.byref(mine), 0, dev)
own = {"created": rc, "context": mine.value, "before": current()}
it = st.stage(path, device)
names = [name for name, _ in it]
own["after a load (tensors dropped as they came)"] = current()
it.close(); gc.collect()
own["after close"] = current()
cuda.cuCtxDestroy_v2(mine)
ok = (all(v == seen["torch's context, before"] for v in seen.values())
      and rc == 0 and own["after a load (tensors dropped as they came)"] == mine.value
      and own["after close"] == mine.value)
print(json.dumps({"ok": ok, "torch": seen, "own": own, "tensors": len(names)}))
"""

# Issue 57.11: the drop-in on a GPU whose memory cannot hold a tensor. GPU memory is filled
# with a torch allocation until less than the tensor is free; then `safetensors` (torch's
# out-of-memory error), ours (an error that is both ours and torch's), ours with
# `host_assembly=True` (the tensor on the CPU, its bytes equal).
OUT_OF_MEMORY = r"""
import json, os, sys, tempfile, torch
import safetensors.torch, safetensors_staging as st, safetensors_staging.torch as stt
dev = sys.argv[1]
path = os.path.join(tempfile.mkdtemp(dir=sys.argv[2]), "big.safetensors")
big = torch.arange(256 << 20, dtype=torch.int32)  # 1 GiB
safetensors.torch.save_file({"big": big}, path)
free, _ = torch.cuda.mem_get_info(dev)
fill = torch.empty(max(free - (512 << 20), 0), dtype=torch.uint8, device=dev)  # 512 MiB left
out = {"free_mib_before": torch.cuda.mem_get_info(dev)[0] >> 20}
def outcome(call):
    try:
        t = call()["big"]
        return {"device": str(t.device), "equal": bool(torch.equal(t.cpu(), big))}
    except Exception as e:
        return {"class": type(e).__name__, "torch_oom": isinstance(e, torch.OutOfMemoryError),
                "ours": isinstance(e, st.StagingError), "message": str(e)[:160]}
out["safetensors"] = outcome(lambda: safetensors.torch.load_file(path, device=dev))
out["ours"] = outcome(lambda: stt.load_file(path, device=dev))
out["ours_host_assembly"] = outcome(lambda: stt.load_file(path, device=dev, host_assembly=True))
del fill
print(json.dumps(out))
"""

DESTINATION_SYNC = r"""
import glob, json, os, sys
import torch
import safetensors_staging as st
from safetensors.torch import load_file
path, device = sys.argv[1], sys.argv[2]
torch.cuda.set_device(device)
want = {}
for f in sorted(glob.glob(os.path.join(path, "*.safetensors")))[:1]:
    want.update(load_file(f, device=device))
names = sorted(want, key=lambda n: -want[n].numel())[:4]
side = torch.cuda.Stream()
def destination(name, info):
    # Queued on the current (side) stream behind ~50 ms of spinning: unless the library waits
    # for this stream before writing, the fill lands after the load's bytes and overwrites them.
    t = torch.empty(info.nbytes, dtype=torch.uint8, device=device)
    torch.cuda._sleep(100_000_000)
    t.fill_(7)
    return t
with torch.cuda.stream(side):
    got = st.load_file(path, device, select=names, destination=destination)
torch.cuda.synchronize()
bad = [n for n in names if not torch.equal(got[n], want[n].reshape(-1).view(torch.uint8))]
print(json.dumps({"tensors": len(names), "bad": bad}))
"""


def python_rows(args, results, facts, total_bytes, device, env):
    """The Python package's rows: load_file on the device (and under a budget), bytes compared on
    the device with safetensors; the MiniLM embedding from weights it loaded."""
    for label, cap in (
        (f"safetensors_staging.load_file(device={device!r})", "none"),
        (
            f"safetensors_staging.load_file(device={device!r}, memory_cap={args.budget})",
            str(parse_gib(args.budget)),
        ),
    ):
        code, out, err, secs, rss, gpu = run_child(
            [sys.executable, "-c", PY_LOAD, args.dir, device, cap], env=env, gpu=device != "cpu"
        )
        row = {
            "what": label,
            "exit": code,
            "wall_s": round(secs, 3),
            "peak_rss_mib": round(rss),
            "peak_device_mib_smi": gpu,
        }
        if code != 0:
            row["error"] = (err.strip().splitlines() or [f"exit {code}"])[-1]
        else:
            r = json.loads(out.strip().splitlines()[-1])
            rep = r["report"]
            row.update(
                {
                    "mode": rep["mode"],
                    "load_s": round(r["seconds"], 3),
                    "gb_per_s": round(total_bytes / r["seconds"] / 1e9, 2),
                    "peak_device_mib_report": rep["peak_device_bytes"] >> 20,
                    "paths": {k: v["tensors"] for k, v in rep["paths"].items()},
                    "read_requests": rep["read_requests"],
                    "bytes_read_gib": round(rep["bytes_read"] / GIB, 3),
                    "fallbacks": rep["fallbacks"],
                    "devices": r["devices"],
                    "bytes_exact": "yes" if r["bad"] == 0 else f"NO: {r['bad']} differ",
                }
            )
        results.append(row)
    # The drop-in for safetensors: safe_open + get_tensor on the device, ours then theirs.
    for which in ("staging", "safetensors"):
        code, out, err, secs, rss, gpu = run_child(
            [sys.executable, "-c", SAFE_OPEN, args.dir, device, which], env=env, gpu=device != "cpu"
        )
        label = "safetensors_staging" if which == "staging" else "safetensors"
        row = {
            "what": f"{label}.safe_open(device={device!r}) + get_tensor, every key",
            "exit": code,
            "wall_s": round(secs, 3),
            "peak_rss_mib": round(rss),
            "peak_device_mib_smi": gpu,
        }
        if code == 0:
            r = json.loads(out.strip().splitlines()[-1])
            row.update(
                {
                    "load_s": round(r["seconds"], 3),
                    "gb_per_s": round(total_bytes / r["seconds"] / 1e9, 2),
                    "devices": r["devices"],
                }
            )
            if which == "staging":
                row.update(
                    {
                        "mode": r["backend"],
                        "bytes_read_gib": round(r["bytes_read"] / GIB, 3),
                        "bytes_exact": "yes" if r["bad"] == 0 else f"NO: {r['bad']} differ",
                    }
                )
        else:
            row["error"] = (err.strip().splitlines() or [f"exit {code}"])[-1]
        results.append(row)
    # A process group of one (NCCL on the GPU): the many-ranks code path as a smoke test. Only
    # one GPU here, so multi-GPU exchange is not run.
    code, out, err, secs, rss, gpu = run_child(
        [sys.executable, "-c", GROUP_OF_ONE, args.dir, device], env=env, gpu=device != "cpu"
    )
    row = {
        "what": f"safetensors_staging.load_file(device={device!r}, process_group=<group of 1>)",
        "exit": code,
        "wall_s": round(secs, 3),
        "peak_rss_mib": round(rss),
        "peak_device_mib_smi": gpu,
    }
    if code == 0:
        r = json.loads(out.strip().splitlines()[-1])
        row.update(
            {
                "mode": r["backend"],
                "load_s": round(r["seconds"], 3),
                "gb_per_s": round(total_bytes / r["seconds"] / 1e9, 2),
                "bytes_read_gib": round(r["bytes_read"] / GIB, 3),
                "bytes_exact": "yes" if r["bad"] == 0 else f"NO: {r['bad']} differ",
            }
        )
    else:
        row["error"] = (err.strip().splitlines() or [f"exit {code}"])[-1]
    results.append(row)
    if device != "cpu":
        # The caller's current device and context are the same after a load and after its
        # tensors are freed (torch's primary context current, then a context of the caller's own).
        code, out, err, *_ = run_child(
            [sys.executable, "-c", CONTEXT, args.dir, device], env=env, gpu=True
        )
        if code == 0:
            r = json.loads(out.strip().splitlines()[-1])
            facts["caller's current device and CUDA context unchanged by load and free"] = (
                f"{'yes' if r['ok'] else 'NO'}: torch {r['torch']}, own context {r['own']}"
            )
            if not r["ok"]:
                results.append(
                    {
                        "what": "caller's context unchanged",
                        "exit": 1,
                        "peak_rss_mib": 0,
                        "bytes_exact": "NO: the context moved",
                        "error": json.dumps(r)[:300],
                    }
                )
        else:
            facts["caller's context check"] = f"failed: {(err.strip().splitlines() or ['?'])[-1]}"
        # A destination still being written on the caller's current stream is waited for.
        code, out, err, *_ = run_child(
            [sys.executable, "-c", DESTINATION_SYNC, args.dir, device], env=env, gpu=True
        )
        if code == 0:
            r = json.loads(out.strip().splitlines()[-1])
            facts["destination filled on a busy side stream, then loaded into"] = (
                "bytes exact" if not r["bad"] else f"NO: {r['bad']} overwritten"
            )
            if r["bad"]:
                results.append(
                    {
                        "what": "destination stream synchronization",
                        "exit": 1,
                        "peak_rss_mib": 0,
                        "bytes_exact": f"NO: {len(r['bad'])} differ",
                        "error": json.dumps(r)[:300],
                    }
                )
        else:
            facts["destination synchronization check"] = (
                f"failed: {(err.strip().splitlines() or ['?'])[-1]}"
            )
    if device != "cpu":
        code, out, err, *_ = run_child(
            [sys.executable, "-c", QWEN, os.path.join(args.dir, "qwen2-small"), device],
            env=env,
            gpu=True,
        )
        if code == 0:
            r = json.loads(out.strip().splitlines()[-1])
            facts[
                f"small Qwen2 by safetensors_staging.transformers.from_pretrained on {device} vs cpu"
            ] = f"weights bit-equal: {r['same_weights']}, logits max |diff| {r['max_abs_diff']:.3g}, on {r['devices']}"
        else:
            facts["small Qwen2 through the transformers helper"] = (
                f"failed: {(err.strip().splitlines() or ['?'])[-1]}"
            )
    if device != "cpu":
        # Reload in place (issue 38): a small Qwen2 on the GPU reloaded from its next step's
        # checkpoint, every parameter in its own memory, the device memory held above the model.
        code, out, err, *_ = run_child(
            [sys.executable, "-c", RELOAD, os.path.join(args.dir, "reload"), device],
            env=env,
            gpu=True,
        )
        if code == 0:
            r = json.loads(out.strip().splitlines()[-1])
            facts[f"load_into(model on {device}, next step's checkpoint)"] = (
                f"bytes equal: {r['same']}, in place: {r['in_place']}, "
                f"{r['extra_device_mib']:.1f} MiB of device memory above the model's "
                f"{r['model_mib']:.0f} MiB (torch.cuda.max_memory_allocated), {r['seconds']:.3f} s, "
                f"paths {r['paths']}, mode {r['mode']}"
            )
            if not (r["same"] and r["in_place"]):
                results.append(
                    {
                        "what": "load_into on the GPU",
                        "exit": 1,
                        "peak_rss_mib": 0,
                        "bytes_exact": "NO" if not r["same"] else "yes, not in place",
                        "error": json.dumps(r)[:300],
                    }
                )
        else:
            facts["load_into on the GPU"] = f"failed: {(err.strip().splitlines() or ['?'])[-1]}"
    if device != "cpu":
        code, out, err, *_ = run_child(
            [sys.executable, "-c", OUT_OF_MEMORY, device, args.dir], env=env, gpu=True
        )
        if code == 0:
            r = json.loads(out.strip().splitlines()[-1])
            facts["drop-in load_file of a 1 GiB tensor with 512 MiB free (issue 57.11)"] = (
                f"safetensors: {r['safetensors']}; ours: {r['ours']}; "
                f"ours with host_assembly=True: {r['ours_host_assembly']}"
            )
        else:
            facts["drop-in out of memory"] = f"failed: {(err.strip().splitlines() or ['?'])[-1]}"
    minilm = os.path.join(os.path.dirname(os.path.abspath(args.stage)), "minilm")
    if os.path.isdir(minilm):
        work = os.path.join(args.dir, "minilm-seeded")
        code, out, err, *_ = run_child(
            [sys.executable, "-c", MINILM, minilm, work, device], env=env
        )
        if code == 0:
            r = json.loads(out.strip().splitlines()[-1])
            facts[
                f"MiniLM (seeded weights) embedding, weights by safetensors_staging on {device} vs transformers on cpu"
            ] = f"max |diff| {r['max_abs_diff']:.3g}, weights bit-equal: {r['same_weights']}, on {r['devices']}"
        else:
            facts["MiniLM embedding"] = f"failed: {(err.strip().splitlines() or ['?'])[-1]}"
    else:
        facts["MiniLM embedding"] = f"not run: no {minilm} (config and tokenizer) carried"


def parse_gib(text):
    units = {"GiB": GIB, "MiB": 1 << 20}
    for unit, scale in units.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * scale)
    return int(text)


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--stage", required=True)
    ap.add_argument("--size-gib", type=float, default=8.0)
    ap.add_argument("--dir", default="/dev/shm/staging-gpu-check")
    ap.add_argument("--out", default=os.environ.get("OUT", "gpu-check-out"))
    ap.add_argument("--modes", default="auto,compat,gds,posix")
    ap.add_argument("--budget", default="4GiB", help="--device-memory for the low-memory run")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument(
        "--range-serve", help="backend-mock's range_serve example: adds a row loading from http://"
    )
    ap.add_argument(
        "--delay-proxy",
        help="backend-mock's delay_proxy example: the http:// row again, 20 ms away",
    )
    ap.add_argument(
        "--fake-hub", help="backend-mock's fake_hub example: adds the hf:// rows (the stand-in Hub)"
    )
    ap.add_argument(
        "--callers-stream",
        help="the callers_stream example: adds rows loading (Rust) on a cudarc "
        "stream of the caller's own, twice through one prepared backend",
    )
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    results, facts = [], {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}

    if shutil.which("nvidia-smi") and not args.dry_run:
        facts["gpu"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
        ).stdout.strip()
    lib = find_libcufile()
    facts["libcufile"] = lib
    env = dict(os.environ)
    if lib:
        env["STAGING_CUFILE_LIB"] = lib
    log(f"libcufile: {lib}")

    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    size = int(args.size_gib * GIB)
    t0 = time.perf_counter()
    try:
        import torch  # noqa: F401

        have_torch = not args.dry_run
    except ImportError:
        have_torch = False
    try:
        import torch  # noqa: F401,F811

        import safetensors_staging  # noqa: F401

        have_python_package = True
    except ImportError as e:
        have_python_package = False
        facts["python package"] = f"not importable: {e}"
    device = "cuda:0" if not args.dry_run else "cpu"
    if have_torch:
        files = write_checkpoint_torch(args.dir, size)
    else:
        subprocess.run(
            [
                args.stage,
                "--keep-synthetic",
                args.dir,
                "--synthetic-size",
                str(size),
                "--backend",
                "host",
                "--json",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            env=env,
        )
        files = sorted(
            os.path.join(args.dir, f) for f in os.listdir(args.dir) if f.endswith(".safetensors")
        )
    total_bytes = sum(os.path.getsize(f) for f in files)
    facts["checkpoint"] = (
        f"{args.dir}: {len(files)} shards, {total_bytes / GIB:.2f} GiB, written in {time.perf_counter() - t0:.1f} s"
    )
    log(facts["checkpoint"])
    expected = reference_hashes(files)

    def stage_row(label, extra, check_bytes=True, path=None, more_env=None):
        backend = (
            [] if "--backend" in extra else ["--backend", "host" if args.dry_run else "cufile"]
        )
        cmd = [args.stage, path or args.dir, *backend, "--json", *extra]
        row_env = {**env, **(more_env or {})}
        code, out, err, secs, rss, gpu = run_child(cmd, env=row_env, gpu=not args.dry_run)
        row = {"what": label, "exit": code, "wall_s": round(secs, 3), "peak_rss_mib": round(rss)}
        if code != 0:
            row["error"] = err.strip().splitlines()[-1] if err.strip() else f"exit {code}"
            results.append(row)
            return
        report = json.loads(out)
        row.update(
            {
                "mode": report["mode"],
                "load_s": round(report["seconds"], 3),
                "gb_per_s": round(report["bytes_per_second"] / 1e9, 2),
                "peak_device_mib_report": report["peak_device_bytes"] >> 20,
                "peak_device_mib_smi": gpu,
                "paths": {k: v["tensors"] for k, v in report["paths"].items()},
                "read_requests": report.get("read_requests"),
                "bytes_read_gib": round(report.get("bytes_read", 0) / GIB, 3),
                "passed_over": report.get("passed_over"),
                "fallbacks": report["fallbacks"],
            }
        )
        if check_bytes:
            code, out, err, *_ = run_child(cmd + ["--checksums"], env=row_env)
            if code != 0:
                row["bytes_exact"] = f"checksum run failed: {err.strip()[-200:]}"
            else:
                got = {t["name"]: t["sha256"] for t in json.loads(out)["tensor_list"]}
                bad = [n for n in expected if got.get(n) != expected[n]]
                row["bytes_exact"] = (
                    "yes" if not bad and len(got) == len(expected) else f"NO: {len(bad)} differ"
                )
        results.append(row)

    for mode in args.modes.split(","):
        stage_row(f"stage cufile {mode}", ["--cufile-mode", mode])
    stage_row(f"stage cufile auto, budget {args.budget}", ["--device-memory", args.budget])
    stage_row("stage cufile auto, 8 threads", ["--threads", "8"])
    # Side by side with the auto row: one request per tensor instead of one per run of
    # back-to-back small tensors (bytes are checked by the rows above; this one is for speed).
    stage_row("stage cufile auto, coalescing off", ["--coalesce-below", "0"], check_bytes=False)
    # One tensor-parallel rank of 8: rows of dimension 0 only, about 1/8 of the bytes read
    # (bytes_read in the table); the bytes of whole tensors do not apply, so not checked here.
    stage_row(
        "stage cufile auto, rank 0 of 8 (--rows '*=0/8')", ["--rows", "*=0/8"], check_bytes=False
    )
    # The default backend, chosen by `auto` (the report says what it passed over, if anything).
    stage_row(
        "stage auto (backend chosen by the library)", ["--backend", "auto"], check_bytes=False
    )
    if args.range_serve:
        # The remote reader on a GPU: ranged GETs from a loopback HTTP server into pinned bounce
        # buffers, each copied to the device while the next is fetched (never run on a GPU yet).
        server = subprocess.Popen(
            [args.range_serve, args.dir, "/gpu/ckpt"], stdout=subprocess.PIPE, text=True
        )
        try:
            base = server.stdout.readline().strip() if server.stdout else ""
            stage_row(
                "stage cufile from http:// (remote reader, pinned bounce)",
                [],
                path=f"{base}/gpu/ckpt",
            )
            if args.delay_proxy:
                # The same 20 ms away (a round trip added to each request by a proxy).
                proxy = subprocess.Popen(
                    [args.delay_proxy, base.removeprefix("http://"), "20"],
                    stdout=subprocess.PIPE,
                    text=True,
                )
                try:
                    far = proxy.stdout.readline().strip() if proxy.stdout else ""
                    stage_row(
                        "stage cufile from http:// 20 ms away (delay_proxy)",
                        [],
                        path=f"{far}/gpu/ckpt",
                    )
                finally:
                    proxy.terminate()
                    proxy.wait(30)
        finally:
            server.terminate()
            server.wait(30)

    # A model from the Hugging Face Hub (issue 36): the test suites' stand-in Hub (the carried
    # `fake_hub` binary) serves the checkpoint on loopback, LFS files through a signed-URL "CDN" on a
    # second port; `hf://` streams it onto the device while writing the Hugging Face cache. The
    # cold row starts from an empty cache; its checksum run is then a warm (local) load, so it
    # checks the bytes the cache holds; the warm row times that local load.
    if args.fake_hub:
        ready = os.path.join(args.out, "fakehub.ready")
        hub_cache = args.dir.rstrip("/") + "-hf-cache"
        shutil.rmtree(hub_cache, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.remove(ready)
        hub = subprocess.Popen(
            [args.fake_hub, "--repo", f"gpu/ckpt={args.dir}", "--ready-file", ready],
            stdout=subprocess.DEVNULL,
        )
        try:
            deadline = time.time() + 300
            while not os.path.exists(ready) and hub.poll() is None and time.time() < deadline:
                time.sleep(0.2)
            line = open(ready).read().strip() if os.path.exists(ready) else ""
            endpoint = line.partition("=")[2]
            if endpoint:
                hub_env = {"HF_ENDPOINT": endpoint, "HF_HUB_CACHE": hub_cache}
                stage_row(
                    "stage cufile from hf:// (fake Hub, cold cache; checksums from the cache)",
                    [],
                    path="hf://gpu/ckpt",
                    more_env=hub_env,
                )
                stage_row(
                    "stage cufile from hf:// (warm cache: a local load)",
                    [],
                    check_bytes=False,
                    path="hf://gpu/ckpt",
                    more_env=hub_env,
                )
            else:
                results.append({"what": "stage from hf://", "error": "the fake Hub did not start"})
        finally:
            hub.terminate()
            hub.wait(30)
            shutil.rmtree(hub_cache, ignore_errors=True)

    if args.callers_stream and not args.dry_run:
        # The Rust API with the caller's own cudarc context and stream (issue 20): every copy to
        # the device on that stream, two loads through one prepared backend; bytes of both
        # loads compared with what Python's safetensors reads.
        for mode in ("posix", "auto"):
            code, out, err, secs, rss, gpu = run_child(
                [args.callers_stream, args.dir, mode], env=env, gpu=True
            )
            row = {
                "what": f"Rust Loader::cuda_stream (caller's stream), {mode}, 2 loads of one Prepared",
                "exit": code,
                "wall_s": round(secs, 3),
                "peak_rss_mib": round(rss),
                "peak_device_mib_smi": gpu,
            }
            if code != 0:
                row["error"] = (err.strip().splitlines() or [f"exit {code}"])[-1]
            else:
                r = json.loads(out.strip().splitlines()[-1])
                first, second = r["loads"]
                row.update(
                    {
                        "mode": first["mode"],
                        "load_s": round(first["seconds"], 3),
                        "gb_per_s": round(first["bytes"] / first["seconds"] / 1e9, 2),
                        "second_load_s": round(second["seconds"], 3),
                    }
                )
                bad = sum(
                    1
                    for load in r["loads"]
                    for n in expected
                    if load["sha256"].get(n) != expected[n]
                )
                row["bytes_exact"] = (
                    "yes"
                    if bad == 0 and all(len(load["sha256"]) == len(expected) for load in r["loads"])
                    else f"NO: {bad} differ"
                )
            results.append(row)

    if have_torch:
        baseline = (
            "import sys, time, torch\n"
            "from safetensors.torch import load_file\n"
            "torch.cuda.init(); torch.zeros(1, device='cuda:0'); torch.cuda.synchronize()\n"
            "t = time.perf_counter(); kept = []\n"
            "for f in sys.argv[1:]:\n"
            "    kept.append(load_file(f, device='cuda:0'))\n"
            "torch.cuda.synchronize(); s = time.perf_counter() - t\n"
            "print(s, torch.cuda.max_memory_allocated())\n"
        )
        code, out, err, secs, rss, gpu = run_child(
            [sys.executable, "-c", baseline, *files], gpu=True
        )
        row = {
            "what": "safetensors.torch.load_file(device='cuda:0')",
            "exit": code,
            "wall_s": round(secs, 3),
            "peak_rss_mib": round(rss),
            "peak_device_mib_smi": gpu,
        }
        if code == 0:
            s, peak = out.split()
            row.update(
                {
                    "load_s": round(float(s), 3),
                    "gb_per_s": round(total_bytes / float(s) / 1e9, 2),
                    "peak_device_mib_report": int(peak) >> 20,
                }
            )
        else:
            row["error"] = err.strip()[-300:]
        results.append(row)
        code, out, err, secs, rss, gpu = run_child(
            [sys.executable, "-c", FASTSAFETENSORS, *files], gpu=True
        )
        row = {
            "what": "fastsafetensors fastsafe_open(nogds=True, device='cuda:0')",
            "exit": code,
            "wall_s": round(secs, 3),
            "peak_rss_mib": round(rss),
            "peak_device_mib_smi": gpu,
        }
        if code == 0:
            r = json.loads(out.strip().splitlines()[-1])
            row.update(
                {
                    "load_s": round(r["seconds"], 3),
                    "gb_per_s": round(total_bytes / r["seconds"] / 1e9, 2),
                    "peak_device_mib_report": r["device_used"] >> 20,
                }
            )
        else:
            row["error"] = (err.strip().splitlines() or [f"exit {code}"])[-1]
        results.append(row)

    if have_python_package:
        python_rows(args, results, facts, total_bytes, device, env)

    pinned = None
    if have_torch:
        code, out, err, *_ = run_child(
            [sys.executable, "-c", PINNED, str(min(total_bytes, 8 * GIB))]
        )
        if code == 0:
            pinned = json.loads(out.strip().splitlines()[-1])["bytes_per_second"] / 1e9
            facts["pinned host-to-device copy (physical limit)"] = f"{pinned:.2f} GB/s"
        else:
            facts["pinned host-to-device copy"] = f"failed: {err.strip()[-200:]}"

    torch_rate = next(
        (r.get("gb_per_s") for r in results if r["what"].startswith("safetensors.torch")), None
    )
    lines = [
        "| what | mode | GB/s | load s | ratio vs torch | of pinned H2D | peak device MiB (report / smi) | peak RSS MiB | bytes exact | read requests | GiB read | paths |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        ratio = f"{r['gb_per_s'] / torch_rate:.2f}" if torch_rate and r.get("gb_per_s") else ""
        of_pinned = f"{r['gb_per_s'] / pinned:.0%}" if pinned and r.get("gb_per_s") else ""
        if "error" in r:
            lines.append(
                f"| {r['what']} | | | | | | | {r['peak_rss_mib']} | | | | error: {r['error'][:120]} |"
            )
            continue
        lines.append(
            f"| {r['what']} | {r.get('mode', '')} | {r.get('gb_per_s', '')} | {r.get('load_s', '')} | {ratio} | {of_pinned} | "
            f"{r.get('peak_device_mib_report', '')} / {r.get('peak_device_mib_smi', '')} | {r['peak_rss_mib']} | "
            f"{r.get('bytes_exact', '')} | {r.get('read_requests', '')} | {r.get('bytes_read_gib', '')} | {r.get('paths', '')} |"
        )
    table = "\n".join(lines)
    facts_text = "\n".join(f"- {k}: {v}" for k, v in facts.items())
    print(facts_text + "\n\n" + table)
    with open(os.path.join(args.out, "gpu-check.md"), "w") as f:
        f.write(facts_text + "\n\n" + table + "\n")
    with open(os.path.join(args.out, "gpu-check.json"), "w") as f:
        json.dump({"facts": facts, "results": results}, f, indent=2)
    shutil.rmtree(args.dir, ignore_errors=True)
    failed = [r for r in results if r.get("bytes_exact", "yes") != "yes"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
