"""The fake Hugging Face Hub for the Python tests: the Rust suite's own stand-in
(`backend_mock::hub::FakeHub`, run as a process: backend-mock's `fake_hub` example), driven over
its stdin. One stand-in Hub for both suites, checked against `huggingface_hub` in
`test_fakehub.py`.

What it speaks, on two sockets of 127.0.0.1 (HTTP/1.1, keep-alive):

- the HUB (`hub.endpoint`, what `HF_ENDPOINT` points at):
  `GET /api/models/{repo}/revision/{rev}` (id, sha, siblings, private, gated),
  `GET /api/models/{repo}/tree/{rev}[/{path}]?recursive=true` (files with git oid, size and, for
  LFS files, `lfs: {oid: sha256, size, pointerSize}`; directories; paged by 1,000 entries, or
  `set_tree_page`, with a `Link: <...>; rel="next"` header), and `HEAD`/`GET
  /{repo}/resolve/{rev}/{path}`: a plain git file is answered 200 (206 for a `Range`) with
  `ETag: "<git blob oid>"` and `X-Repo-Commit`; an LFS file (`*.safetensors`, `*.bin`, `*.pt`,
  `*.model`, or 10 MiB and over) 302 to a signed CDN URL with `X-Linked-Etag: "<sha256>"`,
  `X-Linked-Size` and `X-Repo-Commit`. `{rev}` is a branch, a tag or a full commit. Errors carry
  `X-Error-Code` (`RepoNotFound`, `RevisionNotFound`, `EntryNotFound`, `GatedRepo`),
  `X-Error-Message` and a JSON body `{"error": ...}`.
- the CDN (`hub.cdn`, another port so another origin): `HEAD`/`GET /repos/<sha256>?X-Amz-Expires=
  &Expires=&X-Amz-Signature=`, checking the signature (403 `SignatureDoesNotMatch`) and the
  expiry (403 `AccessDenied`), then 200/206 with an `ETag` that is not the sha256.

Faults (`hub.set_faults(**fields)`, the fields of `HubFaults` in `crates/backend-mock/src/hub/`):
`expire_after`, `expire_once`, `corrupt` (path -> offset), `truncate`, `truncate_first`,
`redirect_loop`, `fail_first`, `missing`, `outage` (a status the Hub answers everything with),
`cdn_hop`. Also a path prefix (`set_prefix`, a mirror's), renamed repos (`rename`), a bandwidth
cap shared by both sockets (`set_rate`), and a log of every request (`log()`).

What it does not: Xet (set `HF_HUB_DISABLE_XET=1` for `huggingface_hub`), datasets and spaces,
uploads, `refs/pr/N`, multi-range requests, compression, TLS.

The binary: `$STAGING_FAKE_HUB` if set, else built here with
`cargo build --release -p backend-mock --example fake_hub` (once per process).

Use:

    with FakeHub() as hub:
        commit = hub.add_repo("org/name", {"config.json": b"{}", "model.safetensors": data})
        os.environ["HF_ENDPOINT"] = hub.endpoint
        hub.set_faults(truncate=["model.safetensors"])
        ... hub.log()
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

REPO = Path(__file__).resolve().parents[3]
_BINARY: Optional[str] = None
_BINARY_LOCK = threading.Lock()


def fake_hub_binary() -> str:
    """The `fake_hub` executable: `$STAGING_FAKE_HUB`, else built (release) in this checkout."""
    global _BINARY
    with _BINARY_LOCK:
        if _BINARY is None:
            given = os.environ.get("STAGING_FAKE_HUB")
            if given:
                _BINARY = given
            else:
                built = subprocess.run(
                    [
                        "cargo",
                        "build",
                        "--release",
                        "--quiet",
                        "-p",
                        "backend-mock",
                        "--example",
                        "fake_hub",
                        "--message-format=json",
                    ],
                    cwd=REPO,
                    capture_output=True,
                    text=True,
                    check=False,
                )
                if built.returncode != 0:
                    raise RuntimeError(f"building the fake Hub failed:\n{built.stderr}")
                for line in built.stdout.splitlines():
                    message = json.loads(line)
                    if message.get("target", {}).get("name") == "fake_hub" and message.get(
                        "executable"
                    ):
                        _BINARY = message["executable"]
                if _BINARY is None:
                    raise RuntimeError("cargo built no fake_hub executable")
        return _BINARY


def git_blob_oid(data: bytes) -> str:
    """The git blob id of `data`: sha1(b"blob <len>\\0" + data), hex (computed here, apart from
    the server, so that the tests check it)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The git-lfs pointer file a repo commits in place of an LFS file."""
    return (
        f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()
    )


@dataclass
class LogEntry:
    """One request as a server saw it. `sent` (body bytes) is counted before each piece is sent,
    so a client that has received the bytes finds them in the log."""

    server: str  # "hub" | "cdn"
    method: str
    path: str  # as sent, percent-encoded, without the query
    query: bool  # whether the URL had a query string
    range: Optional[Tuple[int, int]]  # the range asked for, ends resolved (inclusive)
    status: int
    authorization: Optional[str]  # the Authorization header
    sent: int

    @property
    def auth(self) -> bool:
        """Whether an Authorization header came."""
        return self.authorization is not None


FilesArg = Union[Mapping[str, bytes], Path, str]


class FakeHubError(RuntimeError):
    """The fake Hub refused a command."""


class FakeHub:
    """The fake Hub's process. `with FakeHub() as hub:` starts it and stops it."""

    def __init__(self) -> None:
        self._process: Optional[subprocess.Popen[str]] = None
        self._lock = threading.Lock()
        self.endpoint = ""
        self.cdn = ""

    # -- lifecycle --

    def start(self) -> FakeHub:
        self._process = subprocess.Popen(
            [fake_hub_binary(), "--control"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        assert self._process.stdout is not None
        lines = [self._process.stdout.readline().strip() for _ in range(2)]
        fields = dict(line.partition("=")[::2] for line in lines)
        if "HF_ENDPOINT" not in fields:
            self.close()
            raise RuntimeError(f"the fake Hub did not start: {lines}")
        self.endpoint, self.cdn = fields["HF_ENDPOINT"], fields["CDN"]
        return self

    def close(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.stdin is not None:
            process.stdin.close()  # the process stops when its stdin closes
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, op: str, **fields: Any) -> Any:
        with self._lock:
            process = self._process
            if process is None or process.stdin is None or process.stdout is None:
                raise RuntimeError("the fake Hub is not running")
            process.stdin.write(json.dumps({"op": op, **fields}) + "\n")
            process.stdin.flush()
            answer = json.loads(process.stdout.readline())
        if "error" in answer:
            raise FakeHubError(f"{op}: {answer['error']}")
        return answer["ok"]

    # -- repos --

    @staticmethod
    def _files(files: FilesArg) -> Dict[str, Any]:
        if isinstance(files, (str, Path)):
            return {"dir": str(Path(files).resolve())}
        return {
            "files": {path: base64.b64encode(bytes(data)).decode() for path, data in files.items()}
        }

    def add_repo(
        self,
        repo_id: str,
        files: FilesArg,
        revisions: Optional[Mapping[str, Optional[str]]] = None,
        gated_tokens: Optional[List[str]] = None,
        private_tokens: Optional[List[str]] = None,
    ) -> str:
        """Registers a repo with one commit made from `files` (path -> bytes, or a directory,
        walked recursively, its LFS files served from disk) and returns the commit.
        `revisions`: branch/tag names pointed at this commit (`main` always is).
        `gated_tokens` / `private_tokens`: make the repo gated / private, accepting those."""
        names = [name for name in (revisions or {}) if name != "main"]
        return str(
            self._call(
                "add_repo",
                repo=repo_id,
                revisions=names,
                gated=gated_tokens,
                private=private_tokens,
                **self._files(files),
            )
        )

    def add_commit(self, repo_id: str, files: FilesArg) -> str:
        """A newer commit of `repo_id` whose files are exactly `files`; `main` moves to it."""
        return str(self._call("add_commit", repo=repo_id, **self._files(files)))

    def tag(self, repo_id: str, name: str, commit: str) -> None:
        self._call("tag", repo=repo_id, name=name, commit=commit)

    # -- behaviour --

    def set_faults(self, **fields: Any) -> Dict[str, Any]:
        """Changes the named faults (the others stay) and returns them all. Sets are lists."""
        changes = {
            k: sorted(v) if isinstance(v, (set, frozenset)) else v for k, v in fields.items()
        }
        return dict(self._call("faults", set=changes))

    def faults(self) -> Dict[str, Any]:
        return dict(self._call("faults", set={}))

    def set_rate(self, bytes_per_second: Optional[float]) -> None:
        """Caps the bytes per second of both sockets together (None: no cap)."""
        rate = None if bytes_per_second is None else max(1, int(bytes_per_second))
        self._call("set_rate", rate=rate)

    def set_prefix(self, prefix: str) -> None:
        self._call("set_prefix", prefix=prefix)
        self.endpoint = self._call("endpoints")["endpoint"]

    def rename(self, old: str, new: str) -> None:
        self._call("rename", old=old, new=new)

    def set_tree_page(self, entries: int) -> None:
        self._call("set_tree_page", entries=entries)

    # -- the log --

    def log(self) -> List[LogEntry]:
        return [
            LogEntry(
                server=e["server"],
                method=e["method"],
                path=e["path"],
                query=e["has_query"],
                range=None if e["range"] is None else (e["range"][0], e["range"][1]),
                status=e["status"],
                authorization=e["authorization"],
                sent=e["sent"],
            )
            for e in self._call("log")
        ]

    def clear_log(self) -> None:
        self._call("clear_log")
