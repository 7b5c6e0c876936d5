"""The fake Hub (`fakehub.py`) against the real client, `huggingface_hub` (each call in a child
Python with `HF_ENDPOINT` set, since the library reads its settings at import), and its faults
against plain `urllib`: what a Rust Hub client is tested with must be what the Hub says."""

from __future__ import annotations

import ast
import hashlib
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest
from fakehub import FakeHub, fake_hub_binary, git_blob_oid, lfs_pointer

from conftest import write_sharded

# One child per scenario: `calls` is a list of [function of huggingface_hub, kwargs]; each call's
# result (str) or exception (class, its classes, message) comes back as JSON.
CHILD = r"""
import json, sys
import huggingface_hub as h
out = []
for fn, kwargs in json.loads(sys.argv[1]):
    try:
        out.append({"ok": str(getattr(h, fn)(**kwargs))})
    except Exception as e:
        out.append({"error": type(e).__name__, "classes": [c.__name__ for c in type(e).__mro__],
                    "message": str(e)})
print(json.dumps(out))
"""


def run_hf(
    hub: FakeHub, cache: Path, calls: List[Tuple[str, Dict[str, Any]]], token: Optional[str] = None
) -> List[Dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.pop("TRANSFORMERS_OFFLINE", None)
    env.update(
        HF_ENDPOINT=hub.endpoint,
        HF_HOME=str(cache.parent / "hf_home"),  # no stored token of this machine's user
        HF_HUB_CACHE=str(cache),
        HF_HUB_DISABLE_XET="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
    )
    if token is not None:
        env["HF_TOKEN"] = token
    out = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(calls)],
        env=env,
        cwd=cache.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any) -> None:
        return None


def fetch(
    url: str, method: str = "GET", headers: Optional[Dict[str, str]] = None, follow: bool = False
) -> Tuple[int, Any, bytes]:
    """(status, headers, body) of one request; redirects are not followed unless `follow`."""
    opener = urllib.request.build_opener(*([] if follow else [_NoRedirect]))
    request = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with opener.open(request, timeout=30) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def cdn_url(hub: FakeHub, repo: str, path: str, rev: str = "main") -> str:
    return cdn_url_at(hub.endpoint, repo, path, rev)


def cdn_url_at(endpoint: str, repo: str, path: str, rev: str = "main") -> str:
    """The signed CDN URL the hub redirects an LFS file to."""
    status, headers, _ = fetch(f"{endpoint}/{repo}/resolve/{rev}/{path}", "HEAD")
    assert status == 302, status
    return headers["Location"]


SHA = hashlib.sha256


@pytest.fixture(scope="module")
def sharded_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A transformers-style repo: index, 2 shards, config, tokenizer, a file in a subfolder."""
    d = tmp_path_factory.mktemp("sharded")
    write_sharded(
        d, [[("a", "F32", (256, 256))], [("b", "F16", (512, 256)), ("c", "I8", (1000,))]], seed=3
    )
    (d / "config.json").write_text('{"model_type": "bert"}')
    (d / "tokenizer.json").write_text('{"version": "1.0", "model": {"vocab": {"a": 0}}}')
    (d / "1_Pooling").mkdir()
    (d / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}')
    return d


def files_of(directory: Path) -> Dict[str, bytes]:
    return {
        p.relative_to(directory).as_posix(): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


V1 = {"config.json": b'{"v": 1}', "model.safetensors": bytes(range(256)) * 64}
V2 = {"config.json": b'{"v": 2}', "model.safetensors": bytes(range(256)) * 64}
BIG_TXT = b"0123456789abcdef" * (655360 + 1)  # 10 MiB + 16: LFS by its size


@pytest.fixture
def hub(sharded_dir: Path):
    """A fresh hub (faults off) per test: the sharded repo served from disk, and small ones."""
    with FakeHub() as h:
        h.sharded = h.add_repo("org/sharded", sharded_dir)
        h.v1 = h.add_repo("org/versions", V1, revisions={"main": None, "v1": None})
        h.v2 = h.add_commit("org/versions", V2)
        h.add_repo("org/gated", {"config.json": b"gated"}, gated_tokens=["good"])
        h.add_repo("org/private", {"config.json": b"private"}, private_tokens=["secret"])
        h.add_repo("solo", {"big.txt": BIG_TXT, "small.txt": b"small" * 800_000})
        yield h


# -- the real client --


def test_snapshot_download_leaves_the_cache_huggingface_hub_leaves(
    hub: FakeHub, sharded_dir: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "hub"
    [result] = run_hf(hub, cache, [("snapshot_download", {"repo_id": "org/sharded"})], "hf_read")
    repo_dir = cache / "models--org--sharded"
    snapshot = repo_dir / "snapshots" / hub.sharded
    assert result == {"ok": str(snapshot)}
    assert (repo_dir / "refs" / "main").read_bytes() == hub.sharded.encode()

    expected = files_of(sharded_dir)
    assert sorted(expected) == [
        "1_Pooling/config.json",
        "config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "tokenizer.json",
    ]
    got = sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if not p.is_dir())
    assert got == sorted(expected)
    lfs = {p: SHA(d).hexdigest() for p, d in expected.items() if p.endswith(".safetensors")}
    blob_names = {p: lfs.get(p) or git_blob_oid(d) for p, d in expected.items()}
    for path, data in expected.items():
        link = snapshot / path
        target = os.readlink(link)
        depth = path.count("/") + 2
        assert target == "../" * depth + "blobs/" + blob_names[path], (path, target)
        assert link.read_bytes() == data, path
    assert sorted(p.name for p in (repo_dir / "blobs").iterdir()) == sorted(blob_names.values())
    locks = cache / ".locks" / "models--org--sharded"
    assert sorted(p.name for p in locks.iterdir()) == sorted(
        f"{n}.lock" for n in blob_names.values()
    )

    log = hub.log()
    hub_log = [e for e in log if e.server == "hub"]
    cdn_log = [e for e in log if e.server == "cdn"]
    # The token went to the hub, every time, and never to the CDN.
    assert {e.authorization for e in hub_log} == {"Bearer hf_read"}
    assert [e.auth for e in cdn_log] == [False, False]
    # The CDN sent the shards' bytes, whole; the hub only redirected to it.
    sizes = {f"/repos/{lfs[p]}": len(expected[p]) for p in lfs}
    assert {(e.method, e.path, e.status, e.sent) for e in cdn_log} == {
        ("GET", p, 200, n) for p, n in sizes.items()
    }
    resolve = f"/org/sharded/resolve/{hub.sharded}/"
    assert [(e.method, e.path, e.status) for e in hub_log[:2]] == [
        ("GET", "/api/models/org/sharded/revision/main", 200),
        ("GET", f"/api/models/org/sharded/tree/{hub.sharded}", 200),
    ]
    assert sorted((e.method, e.path[len(resolve) :], e.status) for e in hub_log[2:]) == sorted(
        [("HEAD", p, 302 if p in lfs else 200) for p in expected]
        + [("GET", p, 200) for p in expected if p not in lfs]
    )


def test_a_paged_tree_is_followed_by_huggingface_hub(
    hub: FakeHub, sharded_dir: Path, tmp_path: Path
) -> None:
    """Two entries a page: `huggingface_hub` follows the `Link` header to every file, as it
    does on the Hub's long listings."""
    hub.set_tree_page(2)
    cache = tmp_path / "hub"
    listed, [snapshot] = (
        run_hf(hub, cache, [("list_repo_files", {"repo_id": "org/sharded"})]),
        run_hf(hub, cache, [("snapshot_download", {"repo_id": "org/sharded"})]),
    )
    expected = sorted(files_of(sharded_dir))
    assert sorted(ast.literal_eval(listed[0]["ok"])) == expected  # a list's repr
    got = Path(snapshot["ok"])
    assert sorted(p.relative_to(got).as_posix() for p in got.rglob("*") if p.is_file()) == expected
    pages = [e for e in hub.log() if "/tree/" in e.path]
    # 6 files and a directory, 2 a page: 4 pages for each listing, the later ones by cursor.
    assert len(pages) == 8 and sum(e.query for e in pages) >= 6, pages
    status, headers, body = fetch(f"{hub.endpoint}/api/models/org/sharded/tree/main?recursive=1")
    assert len(json.loads(body)) == 2
    next_url = headers["Link"].split(";")[0].strip("<>")
    assert next_url.startswith(f"{hub.endpoint}/api/models/org/sharded/tree/main?recursive=1&")
    assert headers["Link"].endswith('; rel="next"')
    assert [e["path"] for e in json.loads(fetch(next_url)[2])] == [
        "config.json",
        "model-00001-of-00002.safetensors",
    ]


def test_local_files_only_finds_the_same_snapshot_without_a_request(
    hub: FakeHub, tmp_path: Path
) -> None:
    cache = tmp_path / "hub"
    [online] = run_hf(hub, cache, [("snapshot_download", {"repo_id": "org/sharded"})])
    hub.clear_log()
    [offline] = run_hf(
        hub, cache, [("snapshot_download", {"repo_id": "org/sharded", "local_files_only": True})]
    )
    assert offline == online == {"ok": str(cache / "models--org--sharded/snapshots" / hub.sharded)}
    assert hub.log() == []


def test_hf_hub_download_by_tag_by_commit_and_by_branch(hub: FakeHub, tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    assert hub.v1 != hub.v2
    calls = [
        ("hf_hub_download", {"repo_id": "org/versions", "filename": f, "revision": rev})
        for f, rev in [
            ("config.json", "v1"),
            ("config.json", hub.v2),
            ("config.json", hub.v1),
            ("config.json", None),
            ("model.safetensors", "v1"),
            ("model.safetensors", "main"),
        ]
    ]
    results = run_hf(hub, cache, calls)
    repo_dir = cache / "models--org--versions"
    snap = repo_dir / "snapshots"
    assert results == [
        {"ok": str(snap / hub.v1 / "config.json")},
        {"ok": str(snap / hub.v2 / "config.json")},
        {"ok": str(snap / hub.v1 / "config.json")},
        {"ok": str(snap / hub.v2 / "config.json")},
        {"ok": str(snap / hub.v1 / "model.safetensors")},
        {"ok": str(snap / hub.v2 / "model.safetensors")},
    ]
    assert (snap / hub.v1 / "config.json").read_bytes() == b'{"v": 1}'
    assert (snap / hub.v2 / "config.json").read_bytes() == b'{"v": 2}'
    assert (repo_dir / "refs" / "v1").read_text() == hub.v1
    assert (repo_dir / "refs" / "main").read_text() == hub.v2
    # The same LFS file in both commits is one blob, fetched from the CDN once.
    model = SHA(V1["model.safetensors"]).hexdigest()
    assert (snap / hub.v1 / "model.safetensors").resolve() == repo_dir / "blobs" / model
    assert (snap / hub.v2 / "model.safetensors").resolve() == repo_dir / "blobs" / model
    assert [e.path for e in hub.log() if e.server == "cdn"] == [f"/repos/{model}"]


def test_gated_repo_needs_an_accepted_token(hub: FakeHub, tmp_path: Path) -> None:
    call = ("hf_hub_download", {"repo_id": "org/gated", "filename": "config.json"})
    no_token, bad_token = run_hf(
        hub, tmp_path / "hub", [call, (call[0], {**call[1], "token": "x"})]
    )
    for result in (no_token, bad_token):
        assert result["error"] == "GatedRepoError", result
        assert "Access to model org/gated is restricted" in result["message"], result
    assert "be authenticated to access it. Please log in." in no_token["message"]
    assert "you are not in the authorized list" in bad_token["message"]
    assert [(e.method, e.status, e.authorization) for e in hub.log()] == [
        ("HEAD", 401, None),
        ("HEAD", 403, "Bearer x"),
    ]
    [good] = run_hf(hub, tmp_path / "hub", [call], token="good")
    assert Path(good["ok"]).read_bytes() == b"gated"


def test_private_repo_is_not_found_without_its_token(hub: FakeHub, tmp_path: Path) -> None:
    download = ("hf_hub_download", {"repo_id": "org/private", "filename": "config.json"})
    snapshot = ("snapshot_download", {"repo_id": "org/private"})
    results = run_hf(hub, tmp_path / "hub", [download, snapshot])
    assert [r["error"] for r in results] == ["RepositoryNotFoundError"] * 2, results
    assert {e.status for e in hub.log()} == {401}
    [good] = run_hf(hub, tmp_path / "hub", [download], token="secret")
    assert Path(good["ok"]).read_bytes() == b"private"


def test_unknown_revision_file_and_repo(hub: FakeHub, tmp_path: Path) -> None:
    calls = [
        ("hf_hub_download", {"repo_id": "org/versions", "filename": "config.json", "revision": r})
        for r in ("nope", "0" * 40)
    ]
    calls += [
        ("hf_hub_download", {"repo_id": "org/versions", "filename": "absent.json"}),
        ("snapshot_download", {"repo_id": "org/versions", "revision": "nope"}),
        ("hf_hub_download", {"repo_id": "org/absent", "filename": "config.json"}),
    ]
    results = run_hf(hub, tmp_path / "hub", calls)
    assert [r.get("error") for r in results] == [
        "RevisionNotFoundError",
        "RevisionNotFoundError",
        "RemoteEntryNotFoundError",
        "RevisionNotFoundError",
        "RepositoryNotFoundError",
    ], results
    assert "EntryNotFoundError" in results[2]["classes"]
    assert "Invalid rev id: nope" in results[0]["message"]


# -- the protocol, with urllib --


def test_resolve_headers_of_a_git_file_and_an_lfs_file(hub: FakeHub) -> None:
    base = f"{hub.endpoint}/org/versions/resolve"
    status, headers, body = fetch(f"{base}/v1/config.json", "HEAD")
    assert (status, body) == (200, b"")
    assert headers["ETag"] == f'"{git_blob_oid(V1["config.json"])}"'
    assert headers["X-Repo-Commit"] == hub.v1
    assert headers["Content-Length"] == str(len(V1["config.json"]))
    status, headers, body = fetch(f"{base}/main/config.json", headers={"Range": "bytes=1-3"})
    assert (status, body, headers["Content-Range"]) == (206, b'"v"', "bytes 1-3/8")
    assert headers["X-Repo-Commit"] == hub.v2

    data = V1["model.safetensors"]
    sha = SHA(data).hexdigest()
    status, headers, body = fetch(f"{base}/{hub.v1}/model.safetensors", "HEAD")
    assert (status, body) == (302, b"")
    assert headers["X-Linked-Etag"] == f'"{sha}"'
    assert headers["X-Linked-Size"] == str(len(data))
    assert headers["X-Repo-Commit"] == hub.v1
    assert headers["ETag"] == f'"{git_blob_oid(lfs_pointer(sha, len(data)))}"'
    location = headers["Location"]
    assert location.startswith(f"{hub.cdn}/repos/{sha}?X-Amz-Expires=3600&Expires=")
    status, headers, body = fetch(location)
    assert (status, body) == (200, data)
    assert len(headers["ETag"]) == 34 and sha[:32] not in headers["ETag"]
    status, headers, body = fetch(location, headers={"Range": "bytes=100-"})
    assert (status, body) == (206, data[100:])
    assert headers["Content-Range"] == f"bytes 100-{len(data) - 1}/{len(data)}"
    status, headers, _ = fetch(location, headers={"Range": f"bytes={len(data)}-"})
    assert (status, headers["Content-Range"]) == (416, f"bytes */{len(data)}")


def test_revision_and_tree_listing(hub: FakeHub, sharded_dir: Path) -> None:
    status, _, body = fetch(f"{hub.endpoint}/api/models/org/versions/revision/v1")
    info = json.loads(body)
    assert (status, info["id"], info["sha"], info["private"], info["gated"]) == (
        200,
        "org/versions",
        hub.v1,
        False,
        False,
    )
    assert info["siblings"] == [{"rfilename": "config.json"}, {"rfilename": "model.safetensors"}]
    info = json.loads(fetch(f"{hub.endpoint}/api/models/org/gated/revision/main")[2])
    assert info["gated"] == "auto"

    tree = f"{hub.endpoint}/api/models/org/sharded/tree/main"
    top = json.loads(fetch(tree)[2])
    assert [(e["type"], e["path"]) for e in top] == [
        ("directory", "1_Pooling"),
        ("file", "config.json"),
        ("file", "model-00001-of-00002.safetensors"),
        ("file", "model-00002-of-00002.safetensors"),
        ("file", "model.safetensors.index.json"),
        ("file", "tokenizer.json"),
    ]
    every = json.loads(fetch(tree + "?recursive=true&expand=false")[2])
    assert [e["path"] for e in every] == [e["path"] for e in top[:1]] + [
        "1_Pooling/config.json"
    ] + [e["path"] for e in top[1:]]
    for e in every:
        if e["type"] == "directory":
            assert e["size"] == 0 and len(e["oid"]) == 40
            continue
        data = (sharded_dir / e["path"]).read_bytes()
        assert e["size"] == len(data)
        if e["path"].endswith(".safetensors"):
            sha = SHA(data).hexdigest()
            pointer = lfs_pointer(sha, len(data))
            assert e["oid"] == git_blob_oid(pointer)
            assert e["lfs"] == {"oid": sha, "size": len(data), "pointerSize": len(pointer)}
        else:
            assert e["oid"] == git_blob_oid(data) and "lfs" not in e
    sub = json.loads(fetch(tree + "/1_Pooling")[2])
    assert [e["path"] for e in sub] == ["1_Pooling/config.json"]
    # A plain name over 10 MiB is LFS; under it, a git file.
    solo = {e["path"]: e for e in json.loads(fetch(f"{hub.endpoint}/api/models/solo/tree/main")[2])}
    assert (
        solo["big.txt"]["lfs"]["oid"] == SHA(BIG_TXT).hexdigest() and "lfs" not in solo["small.txt"]
    )


def test_errors_on_every_endpoint(hub: FakeHub) -> None:
    def codes(repo: str, token: Optional[str] = None) -> List[Tuple[int, str]]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        urls = [f"/api/models/{repo}/revision/main", f"/api/models/{repo}/tree/main"]
        urls.append(f"/{repo}/resolve/main/config.json")
        out = []
        for url in urls:
            status, h, body = fetch(hub.endpoint + url, headers=headers)
            code = h.get("X-Error-Code") or ""
            if code:
                assert json.loads(body) == {"error": h["X-Error-Message"]}
            out.append((status, code))
        return out

    assert codes("org/absent") == [(404, "RepoNotFound")] * 3
    assert codes("org/private") == [(401, "RepoNotFound")] * 3
    assert codes("org/private", "wrong") == [(401, "RepoNotFound")] * 3
    assert codes("org/private", "secret") == [(200, "")] * 3
    assert codes("org/gated") == [(200, ""), (200, ""), (401, "GatedRepo")]
    assert codes("org/gated", "wrong")[2] == (403, "GatedRepo")
    assert codes("org/gated", "good")[2] == (200, "")
    status, h, _ = fetch(f"{hub.endpoint}/org/versions/resolve/main/absent")
    assert (status, h["X-Error-Code"], h["X-Repo-Commit"]) == (404, "EntryNotFound", hub.v2)
    status, h, _ = fetch(f"{hub.endpoint}/api/models/org/versions/revision/refs%2Fpr%2F1")
    assert (status, h["X-Error-Code"], h["X-Error-Message"]) == (
        404,
        "RevisionNotFound",
        "Invalid rev id: refs/pr/1",
    )


# -- the faults --


def test_bad_signature_is_refused(hub: FakeHub) -> None:
    url = cdn_url(hub, "org/versions", "model.safetensors")
    status, _, body = fetch(url[:-1] + ("0" if url[-1] != "0" else "1"))
    assert (status, b"<Code>SignatureDoesNotMatch</Code>" in body) == (403, True)
    status, _, body = fetch(url.replace("Expires=", "Expires=1", 1))
    assert (status, b"<Code>SignatureDoesNotMatch</Code>" in body) == (403, True)


def test_expire_once_then_a_re_resolved_url_works(hub: FakeHub) -> None:
    hub.set_faults(expire_once=True)
    first = cdn_url(hub, "org/versions", "model.safetensors")
    status, _, body = fetch(first)
    assert status == 403
    assert body == b"<Error><Code>AccessDenied</Code><Message>Request has expired</Message></Error>"
    second = cdn_url(hub, "org/versions", "model.safetensors")
    assert second != first
    status, _, body = fetch(second)
    assert (status, body) == (200, V1["model.safetensors"])
    assert fetch(first)[0] == 403  # the expired one stays expired
    hub.set_faults(expire_after=0)
    assert fetch(cdn_url(hub, "org/versions", "model.safetensors"))[0] == 403


def test_corrupt_flips_exactly_one_byte(hub: FakeHub, sharded_dir: Path) -> None:
    path = "model-00002-of-00002.safetensors"  # served from disk
    data = (sharded_dir / path).read_bytes()
    offset = len(data) - 1000
    hub.set_faults(corrupt={path: offset})
    url = cdn_url(hub, "org/sharded", path)
    for _ in range(2):  # every time
        status, _, body = fetch(url)
        assert status == 200 and len(body) == len(data)
        assert [i for i in range(len(data)) if body[i] != data[i]] == [offset]
        assert body[offset] == data[offset] ^ 0xFF
    assert fetch(url, headers={"Range": f"bytes=0-{offset - 1}"})[2] == data[:offset]
    body = fetch(url, headers={"Range": f"bytes={offset - 2}-{offset + 2}"})[2]
    assert body == data[offset - 2 : offset] + bytes([data[offset] ^ 0xFF]) + data[offset + 1 :][:2]


def test_truncate_sends_half_then_closes(hub: FakeHub) -> None:
    data = V1["model.safetensors"]
    hub.set_faults(truncate=["model.safetensors"])
    url = cdn_url(hub, "org/versions", "model.safetensors")
    with pytest.raises(http.client.IncompleteRead) as e:
        fetch(url)
    assert e.value.partial == data[: len(data) // 2]
    with pytest.raises(http.client.IncompleteRead) as e:
        fetch(url, headers={"Range": "bytes=1000-1999"})
    assert e.value.partial == data[1000:1500]
    assert [(e.status, e.sent) for e in hub.log() if e.server == "cdn"] == [
        (200, len(data) // 2),
        (206, 500),
    ]


def test_redirect_loop_loops(hub: FakeHub) -> None:
    hub.set_faults(redirect_loop=["config.json"])
    url = f"{hub.endpoint}/org/versions/resolve/main/config.json"
    status, headers, _ = fetch(url)
    assert (status, headers["Location"]) == (302, url)
    with pytest.raises(urllib.error.HTTPError, match="infinite loop"):
        urllib.request.urlopen(url, timeout=30)
    assert {(e.path, e.status) for e in hub.log()} == {
        ("/org/versions/resolve/main/config.json", 302)
    }
    assert len(hub.log()) > 2


def test_fail_first_and_missing(hub: FakeHub) -> None:
    hub.set_faults(fail_first=True)
    url = cdn_url(hub, "org/versions", "model.safetensors")
    data = V1["model.safetensors"]
    assert fetch(url)[0] == 503
    assert fetch(url)[2] == data
    ranged = {"Range": "bytes=0-9"}
    assert fetch(url, headers=ranged)[0] == 503
    assert fetch(url, headers=ranged)[2] == data[:10]
    hub.set_faults(missing=["model.safetensors"])
    status, headers, _ = fetch(f"{hub.endpoint}/org/versions/resolve/main/model.safetensors")
    assert (status, headers["X-Error-Code"]) == (404, "EntryNotFound")
    listing = json.loads(fetch(f"{hub.endpoint}/api/models/org/versions/tree/main")[2])
    assert "model.safetensors" in [e["path"] for e in listing]


def test_rate_caps_the_aggregate_of_four_connections(hub: FakeHub) -> None:
    rate = 4_000_000
    hub.set_rate(rate)
    cdn = cdn_url(hub, "solo", "big.txt")
    plain = f"{hub.endpoint}/solo/resolve/main/small.txt"  # the hub's bodies count too
    each = 2_000_000  # 8 MB in all: 2 s at the rate
    jobs = [(cdn, 0), (cdn, 5_000_000), (plain, 0), (plain, each)]
    got: List[int] = []

    def get(url: str, start: int) -> None:
        body = fetch(url, headers={"Range": f"bytes={start}-{start + each - 1}"})[2]
        got.append(len(body))

    threads = [threading.Thread(target=get, args=job) for job in jobs]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    assert got == [each] * 4
    measured = 4 * each / elapsed
    assert abs(measured - rate) / rate < 0.15, (measured, elapsed)
    hub.set_rate(None)
    t0 = time.monotonic()
    assert len(fetch(cdn)[2]) == len(BIG_TXT)
    assert time.monotonic() - t0 < 1.0


def test_runs_as_a_process(sharded_dir: Path, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    proc = subprocess.Popen(
        [fake_hub_binary(), "--repo", f"org/disk={sharded_dir}", "--rate", "100MB"]
        + ["--ready-file", str(ready)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline().strip() if proc.stdout else ""
        assert line.startswith("HF_ENDPOINT=http://127.0.0.1:"), line
        deadline = time.monotonic() + 10
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ready.read_text() == line + "\n"
        endpoint = line.split("=", 1)[1]
        status, _, body = fetch(f"{endpoint}/org/disk/resolve/main/1_Pooling/config.json")
        assert (status, body) == (200, (sharded_dir / "1_Pooling" / "config.json").read_bytes())
        shard = "model-00001-of-00002.safetensors"
        status, _, body = fetch(cdn_url_at(endpoint, "org/disk", shard))
        assert (status, body) == (200, (sharded_dir / shard).read_bytes())
    finally:
        proc.terminate()
    assert proc.wait(timeout=10) == -signal.SIGTERM  # it serves until killed
