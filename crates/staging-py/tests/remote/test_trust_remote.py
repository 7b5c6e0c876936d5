"""What a checkpoint at a URL may make the loader read, and what the Python door shows of a
caller's secrets. A hostile server (`range_server`'s: HEAD, ranged GET, ETag, redirects)
logs every request: an index naming `%2e%2e/%2e%2e/secret/...` asks for nothing
outside its prefix (over HTTP and over S3's path-style API, where such a request would be signed
with the caller's keys), a redirect to another host is refused unless allowed, and no login or
secret store option appears in an exception, a report, a checkpoint's file list or the option
dump."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pytest
from range_server import RangeServer

import safetensors_staging as st
from safetensors_staging import _native

from conftest import write_safetensors


@pytest.fixture
def server() -> Iterator[RangeServer]:
    with RangeServer() as s:
        yield s


@pytest.fixture
def other_host() -> Iterator[RangeServer]:
    # Another host: another loopback address (Linux answers the whole of 127/8).
    with RangeServer("127.0.0.2") as s:
        yield s


def server_paths(server: RangeServer) -> List[str]:
    return [r.path for r in server.requests()]


def logins(server: RangeServer) -> List[Optional[str]]:
    return [r.authorization for r in server.requests()]


def checkpoint_bytes(tmp_path: Path, seed: int) -> Tuple[bytes, Dict[str, bytes]]:
    path = tmp_path / f"m{seed}.safetensors"
    contents = write_safetensors(path, [("w", "F32", (64, 3)), ("b", "U8", (5,))], seed=seed)
    return path.read_bytes(), contents


def hostile_index(shard: str) -> bytes:
    return json.dumps({"metadata": {}, "weight_map": {"w": shard, "b": shard}}).encode()


HOSTILE = [
    "%2e%2e/%2e%2e/secret/model.safetensors",
    "..%2f..%2fsecret/model.safetensors",
    "../../secret/model.safetensors",
    "..\\..\\secret\\model.safetensors",
    "/secret/model.safetensors",
]


@pytest.mark.parametrize("shard", HOSTILE)
def test_an_index_never_reaches_outside_its_prefix_over_http(
    server: RangeServer, tmp_path: Path, shard: str
) -> None:
    server.objects["/secret/model.safetensors"], _ = checkpoint_bytes(tmp_path, 1)
    server.objects["/models/a/model.safetensors.index.json"] = hostile_index(shard)
    with pytest.raises(st.MalformedCheckpointError, match="shard path") as raised:
        st.load_file(server.url("/models/a/model.safetensors.index.json"), retries=0)
    assert raised.value.kind == "invalid-checkpoint"
    assert all(path.startswith("/models/a/") for path in server_paths(server)), server.log


@pytest.mark.parametrize("shard", HOSTILE)
def test_an_index_never_reaches_outside_its_prefix_in_s3(
    server: RangeServer, tmp_path: Path, shard: str
) -> None:
    # S3's path-style API against the logging server: the request a hostile index would make
    # for s3://bkt/secret/... carries the caller's signature.
    server.objects["/bkt/secret/model.safetensors"], _ = checkpoint_bytes(tmp_path, 1)
    server.objects["/bkt/models/a/model.safetensors.index.json"] = hostile_index(shard)
    options = {
        "aws_endpoint": server.url(""),
        "aws_access_key_id": "AKIDTEST",
        "aws_secret_access_key": "not-shown-anywhere",
        "aws_region": "us-east-1",
    }
    with pytest.raises(st.MalformedCheckpointError, match="shard path") as raised:
        st.load_file(
            "s3://bkt/models/a/model.safetensors.index.json", store_options=options, retries=0
        )
    assert "not-shown-anywhere" not in str(raised.value)
    assert server.log, "the index was never asked for"
    assert all(path.startswith("/bkt/models/a/") for path in server_paths(server)), server.log
    assert all(auth and auth.startswith("AWS4-HMAC-SHA256") for auth in logins(server))


def test_a_redirect_to_another_host_is_refused_unless_allowed_and_then_reported(
    server: RangeServer, other_host: RangeServer, tmp_path: Path
) -> None:
    data, contents = checkpoint_bytes(tmp_path, 2)
    other_host.objects["/elsewhere/model.safetensors"] = data
    server.redirects["/m/model.safetensors"] = other_host.url("/elsewhere/model.safetensors")
    url = server.url("/m/model.safetensors")
    with pytest.raises(st.ReadError, match="redirect refused") as raised:
        st.load_file(url, retries=0)
    assert server.authority in str(raised.value) and other_host.authority in str(raised.value)
    assert other_host.log == []

    with st.stage(
        url,
        "cpu",
        retries=0,
        allow_redirect=["cdn.example.com", other_host.host],
    ) as load:
        got = {name: t.numpy().tobytes() for name, t in load}
        report = load.report()
    assert got == contents
    assert report["redirects"] == [f"{url} -> {other_host.authority}"]


def test_no_login_or_secret_in_any_output_of_the_python_door(
    server: RangeServer, tmp_path: Path
) -> None:
    data, contents = checkpoint_bytes(tmp_path, 3)
    server.objects["/private/model.safetensors"] = data
    url = server.url("/private/model.safetensors").replace("http://", "http://alice:SECRET-PW@")
    shown: List[str] = []

    with st.stage(url, "cpu") as load:
        got = {name: t.numpy().tobytes() for name, t in load}
        shown.append(json.dumps(load.report()))
    assert got == contents
    checkpoint = st.open(url)
    shown += [repr(checkpoint), json.dumps([str(f) for f in checkpoint.files])]
    shown += [repr(checkpoint[name]) for name in checkpoint.keys()]
    with st.safe_open(url, framework="np") as f:
        assert {k: f.get_tensor(k).tobytes() for k in f.keys()} == contents

    missing = url.replace("model.safetensors", "missing.safetensors")
    for call in (
        lambda: st.load_file(missing, retries=0),
        lambda: st.open(missing),
        lambda: st.safe_open(missing, framework="np"),
        lambda: st.load_file("s3://AKID:SECRET-S3@bucket/model", retries=0),
    ):
        with pytest.raises(st.StagingError) as raised:
            call()
        shown.append(str(raised.value))
    assert "missing.safetensors" in shown[-2]

    secrets = {
        "aws_secret_access_key": "SECRET-1",
        "aws_session_token": "SECRET-2",
        "azure_storage_sas_key": "SECRET-3",
        "google_service_account_key": "SECRET-4",
        "aws_endpoint": "http://user:SECRET-5@127.0.0.1:9000",
        "aws_region": "eu-west-1",
    }
    dump = _native._options(store_options=secrets)
    assert "eu-west-1" in dump and "<redacted>" in dump
    shown.append(dump)

    for text in shown:
        assert "SECRET" not in text and "alice" not in text, text
    # Every request carried the login, as Basic authentication.
    assert server.log and all(auth == "Basic YWxpY2U6U0VDUkVULVBX" for auth in logins(server))
