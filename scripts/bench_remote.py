#!/usr/bin/env python3
"""Loading a checkpoint from S3, side by side against one local S3-compatible server (moto,
started here on loopback unless --endpoint is given):

- `stage s3://...` (this project's command, host backend, every tensor kept);
- `safetensors_staging.numpy.load_file("s3://...")` (this project's Python package);
- `staging_stream` (with --only): `safetensors_staging.stage("s3://...")` iterated, each tensor
  dropped as it comes: the memory a load holds beyond the tensors a consumer keeps;
- Run:ai Model Streamer (`runai-model-streamer` + `runai-model-streamer-s3`, CPU), every tensor
  cloned out of its ring buffer and kept, as a loader keeps weights;
- `boto3` downloading every object to a temporary directory, then `safetensors.numpy.load_file`.

Each load runs in a fresh process; rounds are interleaved; GB/s is tensor bytes over the time
of the load inside that process, peak RSS is the process's (`ru_maxrss` from `wait4`), both as
medians. Usage:

    python scripts/bench_remote.py CHECKPOINT_DIR [--write GIB] [--rounds 3] [--stage target/release/stage]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

REPO = Path(__file__).resolve().parents[1]
BUCKET = "bench"

RUNAI = r"""
import sys, time, torch
from runai_model_streamer import SafetensorsStreamer
urls = sys.argv[1:]
kept = {}
t = time.perf_counter()
with SafetensorsStreamer() as streamer:
    streamer.stream_files(urls)
    for name, tensor in streamer.get_tensors():
        kept[name] = tensor.clone()
print(time.perf_counter() - t)
"""

STAGING = r"""
import sys, time
import safetensors_staging.numpy as stn
t = time.perf_counter()
kept = stn.load_file(sys.argv[1], backend="host", unsupported_dtypes="uint8")
print(time.perf_counter() - t)
"""

STREAM = r"""
import sys, time
import safetensors_staging as st
t = time.perf_counter()
with st.stage(sys.argv[1], backend="host") as load:
    for name, tensor in load:
        del tensor  # a consumer that moves each tensor on (to a GPU, say) and keeps nothing here
print(time.perf_counter() - t)
"""

BOTO3 = r"""
import sys, time, tempfile, os
import boto3
from safetensors.numpy import load_file
bucket, keys = sys.argv[1], sys.argv[2:]
client = boto3.client("s3")
kept = {}
t = time.perf_counter()
with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
    for key in keys:
        local = os.path.join(tmp, os.path.basename(key))
        client.download_file(bucket, key, local)
        kept.update(load_file(local))
print(time.perf_counter() - t)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_moto() -> Tuple[subprocess.Popen, str]:
    exe = Path(sys.executable).parent / "moto_server"
    port = free_port()
    proc = subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("moto_server did not start")


def run_rss(cmd: List[str], env: Dict[str, str]) -> Tuple[float, int, str]:
    """Runs `cmd` and reads its peak RSS from `wait4`."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = proc.stdout.read() if proc.stdout else ""
    err = proc.stderr.read() if proc.stderr else ""
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])} failed ({status}): {err[-2000:]}")
    return 0.0, usage.ru_maxrss * 1024, out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stage", type=Path, default=REPO / "target" / "release" / "stage")
    parser.add_argument("--endpoint")
    parser.add_argument(
        "--server", choices=("moto", "range"), default="moto",
        help="moto's S3 server (Python), or backend-mock's range_serve example (Rust, from memory, no auth)",
    )
    parser.add_argument("--only", default="stage,staging_py,runai,boto3")
    parser.add_argument("--write", type=float, metavar="GIB", help="write a synthetic F16 checkpoint of this size first")
    args = parser.parse_args()

    import boto3

    if args.write:
        sys.path.insert(0, str(REPO / "scripts"))
        from bench_python import write_synthetic

        write_synthetic(args.checkpoint, args.write)
    proc = None
    endpoint = args.endpoint
    if endpoint is None and args.server == "moto":
        proc, endpoint = start_moto()
    elif endpoint is None:
        exe = REPO / "target" / "release" / "examples" / "range_serve"
        proc = subprocess.Popen([str(exe), str(args.checkpoint), f"/{BUCKET}/model"], stdout=subprocess.PIPE, text=True)
        endpoint = proc.stdout.readline().strip() if proc.stdout else ""
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_EC2_METADATA_DISABLED": "true",
        "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0",
    }
    os.environ.update(env)
    try:
        files = sorted(p for p in args.checkpoint.iterdir() if p.is_file())
        shards = [p for p in files if p.name.endswith(".safetensors")]
        if args.server == "moto" and args.endpoint is None:
            client = boto3.client("s3")
            client.create_bucket(Bucket=BUCKET)
            t = time.perf_counter()
            for p in files:
                client.upload_file(str(p), BUCKET, f"model/{p.name}")
            print(f"uploaded {len(files)} objects in {time.perf_counter() - t:.1f} s to {endpoint}", file=sys.stderr)
        data = 0
        for p in shards:
            with p.open("rb") as f:
                data += p.stat().st_size - 8 - int.from_bytes(f.read(8), "little")
        url = f"s3://{BUCKET}/model"
        urls = [f"{url}/{p.name}" for p in shards]
        keys = [f"model/{p.name}" for p in shards]
        contenders = {
            "stage": lambda: [str(args.stage), url, "--backend", "host", "--json"],
            "staging_py": lambda: [sys.executable, "-c", STAGING, url],
            "staging_stream": lambda: [sys.executable, "-c", STREAM, url],
            "runai": lambda: [sys.executable, "-c", RUNAI, *urls],
            "boto3": lambda: [sys.executable, "-c", BOTO3, BUCKET, *keys],
        }
        chosen = [c for c in args.only.split(",") if c]
        results: Dict[str, List[Tuple[float, int]]] = {c: [] for c in chosen}
        for r in range(args.rounds):
            for name in chosen:
                try:
                    _, rss, out = run_rss(contenders[name](), env)
                except RuntimeError as e:
                    print(f"round {r} {name}: FAILED: {str(e)[-300:]}", file=sys.stderr)
                    continue
                if name == "stage":
                    seconds = json.loads(out)["seconds"]
                else:
                    seconds = float(out.strip().splitlines()[-1])
                results[name].append((data / seconds / 1e9, rss))
                print(f"round {r} {name}: {data / seconds / 1e9:.3f} GB/s, peak RSS {rss / 2**20:.0f} MiB", file=sys.stderr)
        base = statistics.median(g for g, _ in results["stage"]) if results.get("stage") else None
        print(f"\n{len(shards)} files, {data / 2**30:.2f} GiB of tensors, {args.rounds} rounds, {args.server} server at {endpoint}\n")
        print("| loader | GB/s (median) | vs `stage` | peak RSS (median) |")
        print("| --- | --- | --- | --- |")
        for name in chosen:
            if not results[name]:
                print(f"| {name} | failed every round | | |")
                continue
            gbps = statistics.median(g for g, _ in results[name])
            rss = statistics.median(m for _, m in results[name])
            ratio = f"{gbps / base:.2f}x" if base else "-"
            print(f"| {name} | {gbps:.3f} | {ratio} | {rss / 2**20:.0f} MiB |")
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()
