#!/usr/bin/env python3
"""Loading a checkpoint over HTTP and S3 from nginx (a server nobody here wrote, and not the
bottleneck), against the wire's own ceiling and the other loaders, with and without an added
round trip. Started here, on loopback:

- nginx (Debian's `nginx-light`, or any `nginx` on PATH) serving a directory whose `bench/model`
  is the checkpoint: `http://ADDR/bench/model/FILE`, and, since nginx ignores request
  signatures, path-style S3 `GET`/`HEAD` of `s3://bench/model/FILE` at the same address;
- with `--rtt-ms N` (N > 0), backend-mock's `delay_proxy` example in front of it: each request's
  answer held back by N ms of round trip, the bytes of a body at loopback speed.

Rows (each load a fresh process, rounds interleaved; seconds are the load's own, inside the
process, for the Python rows, and from the process's start to its report for `stage`; sys and peak
RSS are the process's and its children's, from `wait4`, Python's start-up included):

- `curl_mem`: one `curl` per file at once, into /dev/shm (memory): the ceiling;
- `curl_ranges`: one `curl --parallel`, 8 MiB ranges, 16 at once, into /dev/shm;
- `stage_http`, `stage_s3`: `stage URL... --backend host` (this project's command);
- `staging_py`: `safetensors_staging.numpy.load_file("s3://...")`;
- `staging_stream` (only when named in `--only`): `safetensors_staging.stage("s3://...")`
  iterated, each array dropped as it comes: the memory a load holds beyond what its consumer
  keeps;
- `runai`: Run:ai Model Streamer (`runai-model-streamer[-s3]`), each tensor cloned out of its
  buffer and kept, as a loader keeps weights;
- `boto3`: `download_file` of every object to /dev/shm, then `safetensors.numpy.load_file`;
- without added latency, from the local files too: `read2` (two processes, each reading one
  half of the files into fresh memory: the machine's limit), `stage_local` (`stage DIR --backend
  host`: mapped, since mapping became the default for device `cpu`), `stage_local_read`
  (the same with `--map false`: read into memory of its own), `safetensors_np` and `safetensors_pt` (`safetensors.{numpy,torch}.load_file` of every
  file, kept; torch's tensors are mapped from the page cache, not read, so each of their pages
  is touched once).

Usage:

    python benches/bench_remote.py DIR [--write-f32 GB] [--rounds 7] [--rtt-ms 0,20] [--only ROWS]
        [--stage-args "--concurrency 32"]

`--write-f32 GB` first writes a checkpoint of 2 shards, 4096 x 4096 F32 tensors, GB in all.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parents[1]
BUCKET = "bench"

CURL_MEM = r"""
import subprocess, sys, tempfile, time, shutil
tmp = tempfile.mkdtemp(dir="/dev/shm")
t = time.perf_counter()
procs = [subprocess.Popen(["curl", "-sf", "-o", f"{tmp}/{i}", url]) for i, url in enumerate(sys.argv[1:])]
codes = [p.wait() for p in procs]
print(time.perf_counter() - t)
shutil.rmtree(tmp)
sys.exit(max(codes))
"""

CURL_RANGES = r"""
import os, subprocess, sys, tempfile, time, shutil
step, urls = 8 << 20, sys.argv[1:]
tmp = tempfile.mkdtemp(dir="/dev/shm")
entries = []
for n, url in enumerate(urls):
    size = int(os.environ["SIZE_" + str(n)])
    for i, at in enumerate(range(0, size, step)):
        entries.append(f'url = "{url}"\nrange = "{at}-{min(at + step, size) - 1}"\noutput = "{tmp}/{n}.{i}"\n')
config = os.path.join(tmp, "config")
with open(config, "w") as f:
    f.write("next\n".join(entries))
t = time.perf_counter()
code = subprocess.call(["curl", "-sf", "--parallel", "--parallel-max", "16", "-K", config], stdout=subprocess.DEVNULL)
print(time.perf_counter() - t)
shutil.rmtree(tmp)
sys.exit(code)
"""

STAGING = r"""
import sys, time
import safetensors_staging.numpy as stn
t = time.perf_counter()
kept = stn.load_file(sys.argv[1:], backend="host")
print(time.perf_counter() - t)
"""

STREAM = r"""
import sys, time
import safetensors_staging.numpy as stn
t = time.perf_counter()
with stn.stage(sys.argv[1:], backend="host") as load:
    for name, tensor in load:
        del tensor  # a consumer that moves each tensor on (to a GPU, say) and keeps nothing here
print(time.perf_counter() - t)
"""

RUNAI = r"""
import sys, time, torch
from runai_model_streamer import SafetensorsStreamer
kept = {}
t = time.perf_counter()
with SafetensorsStreamer() as streamer:
    streamer.stream_files(sys.argv[1:])
    for name, tensor in streamer.get_tensors():
        kept[name] = tensor.clone()
print(time.perf_counter() - t)
"""

BOTO3 = r"""
import sys, time, tempfile, os, shutil
import boto3
from safetensors.numpy import load_file
bucket, keys = sys.argv[1], sys.argv[2:]
client = boto3.client("s3")
kept = {}
tmp = tempfile.mkdtemp(dir="/dev/shm")
t = time.perf_counter()
for key in keys:
    local = os.path.join(tmp, os.path.basename(key))
    client.download_file(bucket, key, local)
    kept.update(load_file(local))
print(time.perf_counter() - t)
shutil.rmtree(tmp)
"""

READ2 = r"""
import os, sys, time
from concurrent.futures import ProcessPoolExecutor

def read(paths):
    kept = []
    for p in paths:
        buf = bytearray(os.path.getsize(p))  # fresh memory, faulted in by the read
        with open(p, "rb", buffering=0) as f:
            view, got = memoryview(buf), 0
            while got < len(buf):
                n = f.readinto(view[got:])
                if not n:
                    raise EOFError(p)
                got += n
        kept.append(buf)
    return sum(map(len, kept))

if __name__ == "__main__":
    files = sys.argv[1:]
    with ProcessPoolExecutor(2) as pool:
        list(pool.map(abs, [0, 0]))  # both workers started before the clock
        t = time.perf_counter()
        total = sum(pool.map(read, [files[0::2], files[1::2]]))
        print(time.perf_counter() - t)
"""

SAFETENSORS = r"""
import sys, time
kind, files = sys.argv[1], sys.argv[2:]
if kind == "np":
    from safetensors.numpy import load_file
else:
    import torch
    from safetensors.torch import load_file
kept = {}
t = time.perf_counter()
for f in files:
    kept.update(load_file(f))
if kind == "pt":  # mapped, not read: every page touched once (no copy), as a first use would
    for tensor in kept.values():
        flat = tensor.reshape(-1).view(torch.uint8)
        int(flat[::4096].sum())
print(time.perf_counter() - t)
"""


def run_timed(cmd: List[str], env: Dict[str, str]) -> Tuple[float, float, int]:
    """Runs `cmd`: its seconds (see below), and, from
    `wait4`, its kernel time and peak RSS (its children's included)."""
    began = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline() if proc.stdout else ""
    reported = time.perf_counter() - began  # `stage --json` writes its report when the load is done
    out = first + (proc.stdout.read() if proc.stdout else "")
    err = proc.stderr.read() if proc.stderr else ""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])} failed ({proc.returncode}): {err[-2000:]}")
    text = out.strip()
    # `stage`: from the process's start to its report (its report's own seconds leave out the
    # requests for the headers; the tensors' memory is given back after, as curl's files stay
    # in /dev/shm until after the clock); Python: the load's own seconds, the interpreter's
    # start and imports left out.
    seconds = reported if text.startswith("{") else float(text.splitlines()[-1])
    return seconds, usage.ru_stime, usage.ru_maxrss * 1024


def start(cmd: List[str]) -> Tuple[subprocess.Popen, str]:
    """Starts a server that prints its URL as its first line."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip() if proc.stdout else ""
    if not line.startswith("http://"):
        proc.kill()
        raise RuntimeError(f"{cmd[0]} did not start")
    return proc, line


def start_nginx(checkpoint: Path, work: Path) -> Tuple[subprocess.Popen, str]:
    exe = shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.path.exists(exe):
        raise SystemExit("nginx not found: apt-get install nginx-light")
    root = work / "root"
    (root / BUCKET).mkdir(parents=True)
    (root / BUCKET / "model").symlink_to(checkpoint.resolve())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conf = work / "nginx.conf"
    conf.write_text(f"""
worker_processes 1;
daemon off;
error_log {work}/error.log;
pid {work}/nginx.pid;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  sendfile on;
  tcp_nopush on;
  keepalive_requests 100000;
  server {{
    listen 127.0.0.1:{port};
    root {root};
    location / {{ }}
  }}
}}
""")
    proc = subprocess.Popen([exe, "-c", str(conf), "-p", str(work)], stderr=subprocess.PIPE)
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("nginx did not start")


def write_f32(directory: Path, gb: float) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    directory.mkdir(parents=True, exist_ok=True)
    per_tensor = 4096 * 4096 * 4
    count = max(2, round(gb * 1e9 / per_tensor))
    rng = np.random.default_rng(1)
    for shard in range(2):
        names = range(shard, count, 2)
        save_file(
            {f"layer.{i}": rng.standard_normal((4096, 4096), dtype=np.float32) for i in names},
            str(directory / f"model-{shard + 1:05}-of-00002.safetensors"),
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--rtt-ms", default="0,20")
    parser.add_argument("--stage", type=Path, default=REPO / "target" / "release" / "stage")
    parser.add_argument(
        "--proxy", type=Path, default=REPO / "target" / "release" / "examples" / "delay_proxy"
    )
    parser.add_argument(
        "--only",
        default="curl_mem,curl_ranges,stage_http,stage_s3,staging_py,runai,boto3,"
        "read2,stage_local,stage_local_read,safetensors_np,safetensors_pt",
    )
    parser.add_argument("--stage-args", default="", help="more options for the stage rows")
    parser.add_argument("--write-f32", type=float, metavar="GB")
    args = parser.parse_args()

    if args.write_f32:
        write_f32(args.checkpoint, args.write_f32)
    shards = sorted(p for p in args.checkpoint.iterdir() if p.name.endswith(".safetensors"))
    data = 0
    for p in shards:
        with p.open("rb") as f:
            data += p.stat().st_size - 8 - int.from_bytes(f.read(8), "little")
    work = Path(tempfile.mkdtemp(prefix="bench-remote-"))
    work.chmod(0o755)  # nginx's workers run as another user
    servers: List[subprocess.Popen] = []
    try:
        nginx, origin = start_nginx(args.checkpoint, work)
        servers.append(nginx)
        chosen = [c for c in args.only.split(",") if c]
        extra = shlex.split(args.stage_args)
        results: Dict[
            Tuple[int, str], List[Tuple[float, float, int]]
        ] = {}  # seconds, sys, peak RSS
        endpoints: Dict[int, str] = {}
        for rtt in (int(r) for r in args.rtt_ms.split(",")):
            if rtt:
                proxy, endpoints[rtt] = start(
                    [str(args.proxy), origin.removeprefix("http://"), str(rtt)]
                )
                servers.append(proxy)
            else:
                endpoints[rtt] = origin
        env0 = {
            **os.environ,
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
            "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0",
            **{f"SIZE_{n}": str(p.stat().st_size) for n, p in enumerate(shards)},
        }
        local = [str(p) for p in shards]

        def rows(endpoint: str, rtt: int) -> Dict[str, Callable[[], List[str]]]:
            http = [f"{endpoint}/{BUCKET}/model/{p.name}" for p in shards]
            s3 = [f"s3://{BUCKET}/model/{p.name}" for p in shards]
            py = sys.executable
            table = {
                "curl_mem": lambda: [py, "-c", CURL_MEM, *http],
                "curl_ranges": lambda: [py, "-c", CURL_RANGES, *http],
                "stage_http": lambda: [
                    str(args.stage),
                    *http,
                    "--backend",
                    "host",
                    "--json",
                    *extra,
                ],
                "stage_s3": lambda: [str(args.stage), *s3, "--backend", "host", "--json", *extra],
                "staging_py": lambda: [py, "-c", STAGING, *s3],
                "staging_stream": lambda: [py, "-c", STREAM, *s3],
                "runai": lambda: [py, "-c", RUNAI, *s3],
                "boto3": lambda: [py, "-c", BOTO3, BUCKET, *(f"model/{p.name}" for p in shards)],
            }
            if rtt == 0:
                table.update(
                    {
                        "read2": lambda: [py, "-c", READ2, *local],
                        "stage_local": lambda: [
                            str(args.stage),
                            str(args.checkpoint),
                            "--backend",
                            "host",
                            "--json",
                        ],
                        "stage_local_read": lambda: [
                            str(args.stage),
                            str(args.checkpoint),
                            "--backend",
                            "host",
                            "--map",
                            "false",
                            "--json",
                        ],
                        "safetensors_np": lambda: [py, "-c", SAFETENSORS, "np", *local],
                        "safetensors_pt": lambda: [py, "-c", SAFETENSORS, "pt", *local],
                    }
                )
            return table

        for r in range(args.rounds):
            for rtt, endpoint in endpoints.items():
                env = {**env0, "AWS_ENDPOINT_URL": endpoint}
                table = rows(endpoint, rtt)
                for name in chosen:
                    if name not in table:
                        continue
                    try:
                        seconds, sys_s, rss = run_timed(table[name](), env)
                    except RuntimeError as e:
                        print(
                            f"round {r} rtt {rtt} {name}: FAILED: {str(e)[-400:]}", file=sys.stderr
                        )
                        continue
                    results.setdefault((rtt, name), []).append((seconds, sys_s, rss))
                    print(
                        f"round {r} rtt {rtt} ms {name}: {data / seconds / 1e9:.3f} GB/s, sys {sys_s:.2f} s, "
                        f"peak RSS {rss >> 20} MiB",
                        file=sys.stderr,
                    )

        print(
            f"\n{len(shards)} files, {data / 1e9:.2f} GB of tensors, {args.rounds} rounds, nginx at {origin}"
            f"{' ' + shlex.join(extra) if extra else ''}\n"
        )
        print(
            "| added round trip | loader | GB/s (median) | min-max | vs ceiling | sys s (median) | sys vs ceiling | peak RSS MiB (median) |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for rtt in endpoints:

            def median(name: str, i: int) -> Optional[float]:
                got = results.get((rtt, name))
                return statistics.median(x[i] for x in got) if got else None

            # The ceiling: curl into memory; with a round trip added, curl with parallel ranges
            # (16 of 8 MiB at once) through the same proxy, as many connections as the loaders
            # use: the proxy's own cost per connection is in both.
            ceiling = "curl_ranges" if rtt else "curl_mem"
            ceiling = ceiling if median(ceiling, 0) is not None else None
            base_s, base_sys = (median(ceiling, 0), median(ceiling, 1)) if ceiling else (None, None)
            for name in chosen:
                got = results.get((rtt, name))
                if not got:
                    continue
                speeds = [data / x[0] / 1e9 for x in got]
                s, k = median(name, 0), median(name, 1)
                ratio = f"{base_s / s:.2f}" if base_s else "-"
                sys_ratio = f"{k / base_sys:.2f}" if base_sys else "-"
                print(
                    f"| {rtt} ms | {name} | {data / s / 1e9:.2f} | {min(speeds):.2f}-{max(speeds):.2f} | {ratio} "
                    f"| {k:.2f} | {sys_ratio} | {median(name, 2) / 2**20:.0f} |"
                )
            if ceiling:
                print(f"| {rtt} ms | (ceiling: {ceiling}) | | | | | | |")
    finally:
        for proc in servers:
            proc.terminate()
            proc.wait(10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
