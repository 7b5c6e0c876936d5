"""Checkpoints in S3, against a real S3-compatible server started here on loopback: moto's
server mode (`moto_server`, from PyPI). Why moto: it implements the S3 REST API the real client
speaks (SigV4, ranged GET, ETag, If-Match, ListObjectsV2, NoSuchBucket, InvalidAccessKeyId), it
installs with pip, and measured here it served one GET at 0.85 GB/s and 8 MiB ranges at
0.16-0.19 GB/s, against 0.03-0.08 GB/s for `s3s-fs` 0.14 (the last version this toolchain
builds). Every test talks to the server through `AWS_ENDPOINT_URL` and the standard AWS
variables, as a user would."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import boto3
import pytest

import safetensors_staging as st

from conftest import write_sharded

MIB = 1 << 20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_moto(**env: str) -> Tuple[subprocess.Popen, str]:
    """Starts a moto S3 server on loopback; returns it and its endpoint URL."""
    # `python -m moto.server` is what the `moto_server` script runs, found through this
    # interpreter's modules (a venv layered over another has the module and not the script).
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **env},
    )
    deadline = time.time() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            if time.time() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("moto_server did not start") from None
            time.sleep(0.1)


@pytest.fixture(scope="module")
def moto() -> Iterator[str]:
    """A moto S3 server on loopback; yields its endpoint URL."""
    proc, url = start_moto()
    yield url
    proc.terminate()
    proc.wait(10)


@pytest.fixture()
def aws(moto: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The standard AWS environment pointing at the moto server."""
    for key in list(os.environ):
        if key.startswith("AWS_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto)
    return moto


def s3(endpoint: str):
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def upload_dir(endpoint: str, bucket: str, prefix: str, directory: Path) -> None:
    client = s3(endpoint)
    try:
        client.create_bucket(Bucket=bucket)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
    for path in sorted(directory.rglob("*")):
        if path.is_file() and not path.is_symlink():
            # One PUT per object (moto assembles multipart uploads slowly).
            client.put_object(
                Bucket=bucket,
                Key=f"{prefix}/{path.relative_to(directory).as_posix()}",
                Body=path.read_bytes(),
            )


def sha256_by_safetensors(directory: Path) -> Dict[str, str]:
    """Every tensor's SHA-256 as Python `safetensors` reads it from disk."""
    import torch
    from safetensors import safe_open

    out = {}
    for file in sorted(directory.glob("*.safetensors")):
        with safe_open(str(file), "pt") as f:
            for name in f.keys():
                raw = (
                    f.get_tensor(name).contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
                )
                out[name] = hashlib.sha256(raw).hexdigest()
    return out


def data_bytes(directory: Path) -> int:
    """The tensor bytes of every file (file sizes less their headers)."""
    total = 0
    for file in directory.glob("*.safetensors"):
        with file.open("rb") as f:
            total += file.stat().st_size - 8 - int.from_bytes(f.read(8), "little")
    return total


@pytest.fixture(scope="module")
def sharded_dir(tmp_path_factory: pytest.TempPathFactory) -> Tuple[Path, Dict[str, bytes]]:
    directory = tmp_path_factory.mktemp("sharded")
    contents = write_sharded(
        directory,
        [
            [("embed", "BF16", [1024, 1500]), ("norm", "F32", [1500]), ("tiny", "U8", [3])],
            [("layer.0", "F16", [2048, 700]), ("empty", "F32", [0, 4]), ("scalar", "F64", [])],
        ],
        seed=3,
    )
    return directory, contents


def test_stage_cli_checksums_match_safetensors_for_minilm_and_shards(
    aws: str, minilm_dir: Path, sharded_dir: Tuple[Path, Dict[str, bytes]], stage_bin: Path
) -> None:
    directory, _ = sharded_dir
    upload_dir(aws, "models", "minilm", minilm_dir)
    upload_dir(aws, "models", "sharded", directory)
    for prefix, local in (("minilm", minilm_dir), ("sharded", directory)):
        run = subprocess.run(
            [str(stage_bin), f"s3://models/{prefix}", "--backend", "host", "--json", "--checksums"],
            capture_output=True,
            text=True,
            env=os.environ.copy(),
        )
        assert run.returncode == 0, run.stderr
        report = json.loads(run.stdout)
        expected = sha256_by_safetensors(local)
        got = {t["name"]: t["sha256"] for t in report["tensor_list"]}
        assert got == expected
        assert report["mode"] == "remote" and report["backend"] == "host"
        assert report["bytes_read"] == data_bytes(local)


def test_load_file_from_s3_is_byte_exact(
    aws: str, minilm_dir: Path, sharded_dir: Tuple[Path, Dict[str, bytes]]
) -> None:
    import safetensors.torch
    import torch

    upload_dir(aws, "models", "minilm", minilm_dir)
    expected = safetensors.torch.load_file(str(minilm_dir / "model.safetensors"))
    got = st.load_file("s3://models/minilm", concurrency=4, range_size=MIB)
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
        assert torch.equal(
            got[name].view(torch.uint8) if got[name].dim() else got[name],
            tensor.view(torch.uint8) if tensor.dim() else tensor,
        ), name

    directory, contents = sharded_dir
    upload_dir(aws, "models", "sharded", directory)
    with st.stage(
        "s3://models/sharded/model.safetensors.index.json", backend="host", memory_cap=MIB
    ) as load:
        seen = {name: bytes(t.contiguous().view(-1).view(torch.uint8).numpy()) for name, t in load}
        report = load.report()
        assert seen == contents
        assert report["mode"] == "remote"
        assert report["paths"]["host"]["tensors"] > 0, (
            "the 1 MiB cap sends big tensors through host assembly"
        )
    assert load.held() == {"device": 0, "host": 0, "caller": 0}

    info = st.open("s3://models/sharded")
    assert info.keys() == list(contents.keys())
    assert all(f.startswith("s3://models/sharded/") for f in info.files)


def test_malformed_checkpoints_uploaded_as_objects_raise_like_local_ones(
    aws: str, malformed_root: Tuple[Path, Dict[str, List[Path]]]
) -> None:
    client = s3(aws)
    client.create_bucket(Bucket="malformed")
    tried = 0
    root, malformed = malformed_root
    for case, paths in malformed.items():
        ckpt = root / case / "ckpt"
        upload_dir(aws, "malformed", case, ckpt)
        urls = [
            f"s3://malformed/{case}/{Path(p).relative_to(ckpt).as_posix()}"
            if str(p).startswith(str(ckpt))
            else f"s3://malformed/{case}/absent"
            for p in paths
        ]
        with pytest.raises(st.StagingError) as local:
            st.load_file([str(p) for p in paths], backend="host")
        with pytest.raises(st.StagingError) as remote:
            st.load_file(urls, backend="host")
        message = str(remote.value)
        assert "s3://malformed/" in message, (case, message)
        if (
            isinstance(local.value, st.MalformedCheckpointError)
            and "fifo" not in case
            and "directory" not in case
            and "duplicate_tensor_in_directory" != case
        ):
            assert isinstance(remote.value, st.MalformedCheckpointError), (case, message)
        tried += 1
    assert tried == len(malformed)


def test_wrong_credentials_and_a_missing_bucket_are_one_clear_error(
    aws: str, minilm_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    upload_dir(aws, "models", "minilm", minilm_dir)
    with pytest.raises(st.ReadError, match="s3://no-such-bucket/x") as missing:
        st.load_file("s3://no-such-bucket/x", retries=0)
    assert "NoSuchBucket" in str(missing.value) or "not found" in str(missing.value).lower()
    # A server that checks credentials (moto enforces IAM once INITIAL_NO_AUTH_ACTION_COUNT
    # actions are used up: 0 here); these keys are no IAM user's.
    proc, strict = start_moto(INITIAL_NO_AUTH_ACTION_COUNT="0")
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", strict)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWRONGWRONGWRONG0")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
        start = time.time()
        with pytest.raises(st.StagingError, match="s3://models/minilm") as denied:
            st.load_file("s3://models/minilm", retries=3)
        assert time.time() - start < 20, "a denied request is not retried with backoff"
        assert "InvalidAccessKeyId" in str(denied.value) or "403" in str(denied.value), str(
            denied.value
        )
    finally:
        proc.terminate()
        proc.wait(10)


def test_an_object_replaced_mid_load_is_an_error_naming_it(
    aws: str, sharded_dir: Tuple[Path, Dict[str, bytes]]
) -> None:
    directory, contents = sharded_dir
    upload_dir(aws, "models", "replaced", directory)
    load = st.stage(
        "s3://models/replaced", backend="host", threads=1, concurrency=1
    )  # no read-ahead
    with load:
        name, first = next(load)
        assert (
            bytes(first.contiguous().view(-1).view(__import__("torch").uint8).numpy())
            == contents[name]
        )
        shard = "model-00001-of-00002.safetensors"
        # Same size, one byte different (an S3 ETag is the MD5 of the bytes: the same bytes put
        # again are the same version, and harmless).
        changed = bytearray((directory / shard).read_bytes())
        changed[-1] ^= 0xFF
        s3(aws).put_object(Bucket="models", Key=f"replaced/{shard}", Body=bytes(changed))
        with pytest.raises(
            st.ReadError, match=f"s3://models/replaced/{shard} changed during the load"
        ):
            for _ in load:
                pass
        assert load.held()["device"] == 0 and load.held()["host"] == 0


def test_transient_failures_through_a_proxy_are_retried(
    aws: str, sharded_dir: Tuple[Path, Dict[str, bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A proxy in front of moto answers the first GET of each byte range with 503."""
    import http.client
    import http.server
    import threading

    directory, contents = sharded_dir
    upload_dir(aws, "models", "retry", directory)
    upstream = aws.removeprefix("http://")
    seen: set = set()
    failed = []
    lock = threading.Lock()

    class Proxy(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _forward(self) -> None:
            key = (self.command, self.path, self.headers.get("Range"))
            with lock:
                first = key not in seen
                seen.add(key)
            if self.command == "GET" and self.headers.get("Range") and first:
                with lock:
                    failed.append(key)
                self.send_response(503)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            conn = http.client.HTTPConnection(upstream)
            conn.request(self.command, self.path, body=body, headers=dict(self.headers))
            resp = conn.getresponse()
            data = resp.read()
            self.send_response(resp.status)
            for k, v in resp.getheaders():
                if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(k, v)
            # A HEAD's length is the object's, not its (empty) body's.
            self.send_header(
                "Content-Length",
                resp.getheader("Content-Length", "0") if self.command == "HEAD" else str(len(data)),
            )
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_HEAD = _forward

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{server.server_address[1]}")
        import torch

        got = st.load_file("s3://models/retry", backend="host", range_size=MIB, retries=3)
        assert {
            k: bytes(v.contiguous().view(-1).view(torch.uint8).numpy()) for k, v in got.items()
        } == contents
        assert len(failed) > 0, "the proxy failed some requests"
        ranged = [k for k in seen if k[0] == "GET" and k[2]]
        assert len(failed) == len(ranged), "every range failed once and was asked for again"
        # No retries: the first failure is the error, naming the object.
        seen.clear()
        failed.clear()
        with pytest.raises(st.ReadError, match="s3://models/retry/"):
            st.load_file("s3://models/retry", backend="host", retries=0)
    finally:
        server.shutdown()


STREAM_AND_MEASURE = r"""
import json, sys
import safetensors_staging as st
import torch  # imported before the baseline: the bound is about the load, not the interpreter


def status(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


# Resets the peak RSS (VmHWM) to the current RSS, so the peak read at the end is the load's.
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
baseline = status("VmRSS")
largest = seen = 0
# 64 MiB ranges: moto copies the whole object for every ranged GET, so fewer ranges load faster.
with st.stage(sys.argv[1], backend="host", range_size=64 << 20) as load:
    for name, tensor in load:
        largest = max(largest, tensor.nbytes)
        seen += tensor.nbytes
        del tensor  # a consumer that moves each tensor on and keeps nothing here
    held = load.held()
peak = status("VmHWM")
print(json.dumps({"baseline": baseline, "peak": peak, "largest": largest, "seen": seen, "held": held}))
"""


def test_a_streamed_load_holds_bounded_memory_whatever_the_checkpoint_size(
    aws: str, big_checkpoint: Tuple[Path, int]
) -> None:
    """1 GiB from the server through a consumer that keeps nothing: the process's peak RSS above
    its imports stays under the largest tensor plus the read-ahead window (256 MiB of batch, the
    policy's default) plus 128 MiB of slack; a load that held what it had read would need 1 GiB."""
    directory, total = big_checkpoint
    upload_dir(aws, "models", "big", directory)
    run = subprocess.run(
        [sys.executable, "-c", STREAM_AND_MEASURE, "s3://models/big"],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
    )
    assert run.returncode == 0, run.stderr
    m = json.loads(run.stdout.strip().splitlines()[-1])
    assert m["seen"] == total
    grown = m["peak"] - m["baseline"]
    bound = m["largest"] + (256 << 20) + (128 << 20)
    print(
        f"\nstreamed {total / 2**30:.2f} GiB: peak RSS {grown / 2**20:.0f} MiB above imports "
        f"(bound {bound / 2**20:.0f} MiB)"
    )
    assert grown < bound, m
    assert grown < total // 2, m
    assert grown >= m["largest"], f"the peak must at least hold one tensor: is it measured? {m}"
    assert m["held"] == {"device": 0, "host": 0, "caller": 0}, m
