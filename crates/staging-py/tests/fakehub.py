"""A fake Hugging Face Hub on loopback, for tests and benchmarks of Hub clients (stdlib only).

What it speaks (HTTP/1.1, keep-alive, a thread per connection), on two sockets of 127.0.0.1:

- the HUB (`hub.endpoint`, what `HF_ENDPOINT` points at):
  `GET /api/models/{repo}/revision/{rev}` (id, sha, siblings, private, gated),
  `GET /api/models/{repo}/tree/{rev}[/{path}]?recursive=true` (files with git oid, size and, for
  LFS files, `lfs: {oid: sha256, size, pointerSize}`; directories), and `HEAD`/`GET
  /{repo}/resolve/{rev}/{path}`: a plain git file is answered 200 (206 for a `Range`) with
  `ETag: "<git blob oid>"` and `X-Repo-Commit`; an LFS file (`*.safetensors`, `*.bin`, `*.pt`,
  `*.model`, or over 10 MiB) 302 to a signed CDN URL with `X-Linked-Etag: "<sha256>"`,
  `X-Linked-Size` and `X-Repo-Commit`. `{rev}` is a branch, a tag or a full commit.
  Errors carry `X-Error-Code` (`RepoNotFound`, `RevisionNotFound`, `EntryNotFound`, `GatedRepo`),
  `X-Error-Message` and a JSON body `{"error": ...}`: unknown repo 404; gated repo without a
  good token 401 (no token) or 403 (a token it does not accept) on resolve only; private repo
  without a good token 401 `RepoNotFound` on every endpoint.
- the CDN (`hub.cdn`, another port so another origin): `HEAD`/`GET /repos/<sha256>?X-Amz-Expires=
  &Expires=&X-Amz-Signature=`, checking the HMAC signature (403 `SignatureDoesNotMatch`) and the
  expiry (403 `AccessDenied`, "Request has expired"), then 200/206 with `ETag` (md5 of the sha256
  text: deliberately NOT the sha256) and `Content-Range`.

What it fakes: repos, commits, branches and tags registered in memory (`add_repo`, `add_commit`);
file bytes from memory (served as memoryview slices) or from a directory (served from disk with
`os.sendfile`, so a 2 GB file is never held in memory); faults a test switches on while serving
(`hub.faults`, see `Faults`); a bandwidth cap shared by every connection of both sockets
(`hub.set_rate`); a log of every request (`hub.log()`).

What it does not: Xet (no `X-Xet-Hash`; set `HF_HUB_DISABLE_XET=1` for `huggingface_hub`),
pagination (the tree is one page, no `Link` header), datasets and spaces (models only), uploads,
`refs/pr/N`, multi-range requests, compression, TLS.

Use:

    with FakeHub() as hub:
        commit = hub.add_repo("org/name", {"config.json": b"{}", "model.safetensors": data})
        os.environ["HF_ENDPOINT"] = hub.endpoint
        hub.faults.truncate.add("model.safetensors")
        ... hub.log()

As a process (benchmarks): `python fakehub.py --repo org/name=DIR [--repo ...] [--rate 100MB]
[--ready-file F]` prints `HF_ENDPOINT=http://127.0.0.1:PORT` (and writes that line to F) and
serves until killed.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import math
import os
import re
import secrets
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Set, Tuple, Union
from urllib.parse import parse_qs, unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".model")
LFS_MIN_SIZE = 10 * 1024 * 1024  # a file larger than this is LFS whatever its name
CHUNK = 1 << 20  # bytes per send when unlimited
RATE_CHUNK = 64 << 10  # bytes per send when rate-capped
BURST = 0.02  # seconds of credit a rate-capped bucket holds


def git_blob_oid(data: bytes) -> str:
    """The git blob id of `data`: sha1(b"blob <len>\\0" + data), hex."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The git-lfs pointer file a repo commits in place of an LFS file."""
    return (
        f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()
    )


def is_lfs(path: str, size: int) -> bool:
    return path.endswith(LFS_SUFFIXES) or size > LFS_MIN_SIZE


class Blob:
    """A file's bytes: in memory (`data`) or on disk (`fd`, read by offset, never by position)."""

    def __init__(self, data: Optional[bytes] = None, disk: Optional[Path] = None) -> None:
        self.view: Optional[memoryview] = None
        self.fd: Optional[int] = None
        if disk is not None:
            self.fd = os.open(disk, os.O_RDONLY)
            self.size = os.fstat(self.fd).st_size
        else:
            assert data is not None
            self.view = memoryview(data)
            self.size = len(data)

    def read(self, offset: int, n: int) -> bytes:
        if self.view is not None:
            return bytes(self.view[offset : offset + n])
        assert self.fd is not None
        out = bytearray()
        while len(out) < n:
            got = os.pread(self.fd, min(CHUNK, n - len(out)), offset + len(out))
            if not got:
                raise OSError(f"file shrank under the fake hub at {offset + len(out)}")
            out += got
        return bytes(out)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


@dataclass
class RepoFile:
    path: str
    blob: Blob
    git_oid: str  # of the content, or of the LFS pointer for an LFS file
    sha256: Optional[str]  # LFS files only
    pointer_size: int  # LFS files only (0 otherwise)

    @property
    def lfs(self) -> bool:
        return self.sha256 is not None


@dataclass
class LogEntry:
    """One request as a server saw it. An entry is logged before its response's headers go, and
    `sent` (body bytes) is counted before each send, so a client that has received the bytes
    finds them in the log (a send that then fails was counted all the same)."""

    server: str  # "hub" | "cdn"
    method: str
    path: str  # as sent, percent-encoded, without the query
    query: bool  # whether the URL had a query string
    range: Optional[str]  # the Range header
    status: int
    auth: bool  # whether an Authorization header came
    authorization: Optional[str]  # its value, logged for the hub only
    sent: int = 0


class RateLimiter:
    """One token bucket for every connection of both sockets (like one NIC): `take(n)` waits
    until n bytes may go. It holds at most BURST seconds of credit (and none right after the rate
    is set), so over a second or more the aggregate is the rate."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rate: Optional[float] = None
        self._next = 0.0

    @property
    def rate(self) -> Optional[float]:
        return self._rate

    @rate.setter
    def rate(self, bytes_per_second: Optional[float]) -> None:
        if bytes_per_second is not None and bytes_per_second <= 0:
            raise ValueError(f"rate must be positive or None, not {bytes_per_second}")
        with self._lock:
            self._rate = None if bytes_per_second is None else float(bytes_per_second)
            self._next = time.monotonic()

    def take(self, n: int) -> None:
        if self._rate is None:
            return
        with self._lock:
            rate = self._rate
            if rate is None:
                return
            now = time.monotonic()
            # Up to BURST seconds of unused time is credit: a sender that overslept (the
            # scheduler, sleep's granularity) catches up instead of losing the slot.
            start = max(self._next, now - BURST)
            self._next = start + n / rate
        if start > now:
            time.sleep(start - now)


class Faults:
    """What a test switches on; all off by default, changeable while serving (assign attributes
    or mutate the sets and dicts; the servers only test membership, which the GIL keeps whole).
    Paths are paths in a repo ("model-00001-of-00002.safetensors"), of any repo.

    - `expire_after`: seconds (whole) a signed CDN URL is valid; 0 = expired when used.
    - `expire_once`: the first signed URL issued for each (repo, path) is already expired; later
      ones are valid. Setting it (again) re-arms it for every file.
    - `corrupt`: path -> offset: the CDN serves that byte XOR 0xFF, every time.
    - `truncate`: paths whose every CDN GET sends its headers and half its body, then closes.
    - `redirect_loop`: paths whose resolve answers 302 to the same resolve URL.
    - `fail_first`: the first CDN GET of each (path, Range) answers 503. Setting it re-arms it.
    - `missing`: paths listed in the tree but answered 404 EntryNotFound by resolve.
    - `gated`, `private`: repo -> accepted tokens (`add_repo` fills them).
    - `rate`: bytes per second shared by all connections; None = unlimited.
    """

    def __init__(self, limiter: RateLimiter) -> None:
        self._lock = threading.Lock()
        self._limiter = limiter
        self.expire_after: float = 3600
        self._expire_once = False
        self._expired_issued: Set[Tuple[str, str]] = set()
        self.corrupt: Dict[str, int] = {}
        self.truncate: Set[str] = set()
        self.redirect_loop: Set[str] = set()
        self._fail_first = False
        self._failed: Set[Tuple[str, Optional[str]]] = set()
        self.missing: Set[str] = set()
        self.gated: Dict[str, List[str]] = {}
        self.private: Dict[str, List[str]] = {}

    @property
    def expire_once(self) -> bool:
        return self._expire_once

    @expire_once.setter
    def expire_once(self, on: bool) -> None:
        with self._lock:
            self._expire_once = bool(on)
            self._expired_issued.clear()

    @property
    def fail_first(self) -> bool:
        return self._fail_first

    @fail_first.setter
    def fail_first(self, on: bool) -> None:
        with self._lock:
            self._fail_first = bool(on)
            self._failed.clear()

    @property
    def rate(self) -> Optional[float]:
        return self._limiter.rate

    @rate.setter
    def rate(self, bytes_per_second: Optional[float]) -> None:
        self._limiter.rate = bytes_per_second

    def _first_issue_expired(self, repo_id: str, path: str) -> bool:
        with self._lock:
            if not self._expire_once or (repo_id, path) in self._expired_issued:
                return False
            self._expired_issued.add((repo_id, path))
            return True

    def _first_get_fails(self, paths: Iterable[str], range_header: Optional[str]) -> bool:
        with self._lock:
            if not self._fail_first:
                return False
            key = (min(paths), range_header)
            if key in self._failed:
                return False
            self._failed.add(key)
            return True


class Repo:
    def __init__(self, repo_id: str) -> None:
        self.repo_id = repo_id
        self.commits: Dict[str, Dict[str, RepoFile]] = {}
        self.refs: Dict[str, str] = {}
        self.last: Optional[str] = None

    def resolve(self, rev: str) -> Optional[str]:
        if rev in self.refs:
            return self.refs[rev]
        if rev in self.commits:
            return rev
        return None


FilesArg = Union[Mapping[str, bytes], Path]


def _files_of(files: FilesArg) -> Dict[str, Blob]:
    if isinstance(files, (str, Path)):
        root = Path(files)
        if not root.is_dir():
            raise ValueError(f"{root} is not a directory")
        out: Dict[str, Blob] = {}
        for p in sorted(root.rglob("*")):
            rel = p.relative_to(root).as_posix()
            if not p.is_file() or rel.split("/")[0] == ".git":
                continue
            size = p.stat().st_size
            if is_lfs(rel, size):
                out[rel] = Blob(disk=p)
            else:
                out[rel] = Blob(data=p.read_bytes())
        return out
    return {path: Blob(data=bytes(data)) for path, data in files.items()}


def _sha256_of(blob: Blob) -> str:
    h = hashlib.sha256()
    for offset in range(0, blob.size, 8 * CHUNK):
        if blob.view is not None:
            h.update(blob.view[offset : offset + 8 * CHUNK])
        else:
            h.update(blob.read(offset, min(8 * CHUNK, blob.size - offset)))
    return h.hexdigest()


class FakeHub:
    """The two servers. `with FakeHub() as hub:` starts them and stops them (and closes files)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._repos: Dict[str, Repo] = {}
        self._by_sha: Dict[str, Tuple[Blob, Set[str]]] = {}  # sha256 -> blob, paths
        self._log: List[LogEntry] = []
        self._limiter = RateLimiter()
        self.faults = Faults(self._limiter)
        self._secret = secrets.token_bytes(32)
        self._servers: List[_Server] = []
        self._threads: List[threading.Thread] = []
        self._blobs: List[Blob] = []
        self.endpoint = ""
        self.cdn = ""

    # -- lifecycle --

    def start(self) -> FakeHub:
        for role in ("hub", "cdn"):
            server = _Server(("127.0.0.1", 0), _Handler)
            server.hub, server.role = self, role
            thread = threading.Thread(
                target=server.serve_forever, args=(0.05,), name=f"fakehub-{role}"
            )
            thread.daemon = True
            thread.start()
            self._servers.append(server)
            self._threads.append(thread)
        self.endpoint = f"http://127.0.0.1:{self._servers[0].server_address[1]}"
        self.cdn = f"http://127.0.0.1:{self._servers[1].server_address[1]}"
        return self

    def close(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.close_connections()
            server.server_close()
        for thread in self._threads:
            thread.join()
        self._servers.clear()
        self._threads.clear()
        for blob in self._blobs:
            blob.close()

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- repos --

    def add_repo(
        self,
        repo_id: str,
        files: FilesArg,
        revisions: Optional[Mapping[str, Optional[str]]] = None,
        gated_tokens: Optional[List[str]] = None,
        private_tokens: Optional[List[str]] = None,
    ) -> str:
        """Registers a repo with one commit made from `files` (path -> bytes, or a directory,
        walked recursively; its LFS files are served from disk) and returns the commit.
        `revisions`: branch/tag name -> None (this commit); default {"main": None}.
        `gated_tokens` / `private_tokens`: make the repo gated / private, accepting those."""
        with self._lock:
            if repo_id in self._repos:
                raise ValueError(f"repo {repo_id} exists: add_commit adds to it")
            self._repos[repo_id] = Repo(repo_id)
        if gated_tokens is not None:
            self.faults.gated[repo_id] = list(gated_tokens)
        if private_tokens is not None:
            self.faults.private[repo_id] = list(private_tokens)
        return self.add_commit(repo_id, files, revisions)

    def add_commit(
        self,
        repo_id: str,
        files: FilesArg,
        revisions: Optional[Mapping[str, Optional[str]]] = None,
    ) -> str:
        """Adds a commit of `files` (the whole tree, not a diff) to `repo_id` and returns it.
        `revisions`: names to point at it (None) or at an existing commit (its hash);
        default {"main": None}. Names not given keep their commit (a tag "v1" stays old)."""
        blobs = _files_of(files)
        entries: Dict[str, RepoFile] = {}
        for path, blob in blobs.items():
            self._blobs.append(blob)
            if is_lfs(path, blob.size):
                sha = _sha256_of(blob)
                pointer = lfs_pointer(sha, blob.size)
                entries[path] = RepoFile(path, blob, git_blob_oid(pointer), sha, len(pointer))
            else:
                data = blob.read(0, blob.size)
                entries[path] = RepoFile(path, blob, git_blob_oid(data), None, 0)
        with self._lock:
            repo = self._repos.get(repo_id)
            if repo is None:
                raise ValueError(f"no repo {repo_id}: add_repo first")
            listing = "\n".join(f"{p} {e.git_oid}" for p, e in sorted(entries.items()))
            commit = hashlib.sha1(f"{repo_id}\n{repo.last or ''}\n{listing}".encode()).hexdigest()
            repo.commits[commit] = entries
            repo.last = commit
            for name, target in (revisions or {"main": None}).items():
                if target is not None and target not in repo.commits:
                    raise ValueError(f"{name} -> {target}: not a commit of {repo_id}")
                repo.refs[name] = target or commit
            for e in entries.values():
                if e.sha256 is not None:
                    blob_paths = self._by_sha.setdefault(e.sha256, (e.blob, set()))
                    blob_paths[1].add(e.path)
        return commit

    # -- observation and control --

    def log(self) -> List[LogEntry]:
        with self._lock:
            return list(self._log)

    def clear_log(self) -> None:
        with self._lock:
            self._log.clear()

    def set_rate(self, bytes_per_second: Optional[float]) -> None:
        """Caps the bytes per second of all bodies of both sockets together; None = unlimited."""
        self._limiter.rate = bytes_per_second

    def signed_url(self, sha256: str, expires: int) -> str:
        """The CDN URL of an LFS blob, valid until `expires` (unix seconds)."""
        life = max(0, int(self.faults.expire_after))
        sig = self._sign(sha256, expires, life)
        return f"{self.cdn}/repos/{sha256}?X-Amz-Expires={life}&Expires={expires}&X-Amz-Signature={sig}"

    def _sign(self, sha256: str, expires: int, life: int) -> str:
        return hmac.new(self._secret, f"{sha256}\n{expires}\n{life}".encode(), "sha256").hexdigest()

    def _append(self, entry: LogEntry) -> None:
        with self._lock:
            self._log.append(entry)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128
    hub: FakeHub
    role: str

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._conns: Set[socket.socket] = set()
        self._conns_lock = threading.Lock()

    def process_request(self, request, client_address):  # type: ignore[no-untyped-def]
        with self._conns_lock:
            self._conns.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request):  # type: ignore[no-untyped-def]
        with self._conns_lock:
            self._conns.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        with self._conns_lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


_RANGE = re.compile(r"bytes=(\d*)-(\d*)$")


def _parse_range(header: Optional[str], size: int) -> Optional[Tuple[int, int]]:
    """(first, last) inclusive; None for no (or an unsupported) Range; (-1, -1) unsatisfiable."""
    if header is None:
        return None
    m = _RANGE.match(header.strip())
    if m is None:
        return None
    a, b = m.groups()
    if a == "" and b == "":
        return None
    if a == "":
        n = int(b)
        if n == 0 or size == 0:
            return (-1, -1)
        return (max(0, size - n), size - 1)
    first = int(a)
    last = size - 1 if b == "" else min(int(b), size - 1)
    if first >= size or last < first:
        return (-1, -1)
    return (first, last)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: _Server
    server_version = "fakehub"
    sys_version = ""

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass

    # -- plumbing --

    def _start(self, status: int, headers: List[Tuple[str, str]], length: int) -> LogEntry:
        hub = self.server.hub
        auth = self.headers.get("Authorization")
        entry = LogEntry(
            server=self.server.role,
            method=self.command,
            path=urlsplit(self.path).path,
            query=bool(urlsplit(self.path).query),
            range=self.headers.get("Range"),
            status=status,
            auth=auth is not None,
            authorization=auth if self.server.role == "hub" else None,
        )
        hub._append(entry)
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(length))
        self.end_headers()
        return entry

    def _small(self, status: int, headers: List[Tuple[str, str]], body: bytes) -> None:
        entry = self._start(status, headers, len(body))
        if self.command != "HEAD" and body:
            entry.sent = len(body)
            self.wfile.write(body)

    def _json(self, status: int, value: object, headers: Optional[List[Tuple[str, str]]] = None):
        body = json.dumps(value).encode()
        self._small(status, [("Content-Type", "application/json"), *(headers or [])], body)

    def _error(self, status: int, code: str, message: str, extra=()) -> None:  # type: ignore[no-untyped-def]
        headers = [("X-Error-Code", code), ("X-Error-Message", message), *extra]
        self._json(status, {"error": message}, headers)

    def _xml_error(self, status: int, code: str, message: str) -> None:
        body = f"<Error><Code>{code}</Code><Message>{message}</Message></Error>".encode()
        self._small(status, [("Content-Type", "application/xml")], body)

    def _send_body(
        self, entry: LogEntry, blob: Blob, start: int, length: int, corrupt_at: Optional[int]
    ) -> None:
        limiter = self.server.hub._limiter
        sock = self.connection
        pos, end = start, start + length
        while pos < end:
            n = min(end - pos, CHUNK if limiter.rate is None else RATE_CHUNK)
            limiter.take(n)
            entry.sent += n  # before the send: a client that has the bytes sees them counted
            if corrupt_at is not None and pos <= corrupt_at < pos + n:
                chunk = bytearray(blob.read(pos, n))
                chunk[corrupt_at - pos] ^= 0xFF
                sock.sendall(chunk)
            elif blob.view is not None:
                sock.sendall(blob.view[pos : pos + n])
            else:
                assert blob.fd is not None
                done = 0
                while done < n:
                    sent = os.sendfile(sock.fileno(), blob.fd, pos + done, n - done)
                    if sent == 0:
                        raise OSError("sendfile sent nothing: the file shrank")
                    done += sent
            pos += n

    def _serve_bytes(
        self,
        blob: Blob,
        headers: List[Tuple[str, str]],
        corrupt_at: Optional[int] = None,
        cut: bool = False,
    ) -> None:
        size = blob.size
        rng = _parse_range(self.headers.get("Range"), size)
        headers = [*headers, ("Accept-Ranges", "bytes")]
        if rng == (-1, -1):
            self._small(416, [*headers, ("Content-Range", f"bytes */{size}")], b"")
            return
        if rng is None:
            status, start, length = 200, 0, size
        else:
            status, start, length = 206, rng[0], rng[1] - rng[0] + 1
            headers.append(("Content-Range", f"bytes {rng[0]}-{rng[1]}/{size}"))
        entry = self._start(status, headers, length)
        if self.command == "HEAD":
            return
        self.wfile.flush()
        if cut:
            self._send_body(entry, blob, start, length // 2, corrupt_at)
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self._send_body(entry, blob, start, length, corrupt_at)

    def do_GET(self) -> None:
        try:
            if self.server.role == "hub":
                self._hub()
            else:
                self._cdn()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    do_HEAD = do_GET

    # -- the hub --

    def _token(self) -> Optional[str]:
        auth = self.headers.get("Authorization")
        if auth is None or not auth.startswith("Bearer "):
            return None
        return auth[len("Bearer ") :].strip()

    def _hub(self) -> None:
        hub = self.server.hub
        url = urlsplit(self.path)
        parts = url.path.split("/")[1:]  # percent-encoded segments
        query = parse_qs(url.query)
        if parts[:2] == ["api", "models"]:
            kind, repo_id, rest = _split_repo(parts[2:], ("revision", "tree"), hub._repos)
        else:
            kind, repo_id, rest = _split_repo(parts, ("resolve",), hub._repos)
        if kind is None or repo_id is None or not rest:
            self._error(404, "NotFound", f"Sorry, we can't find the page {url.path}")
            return
        repo = hub._repos.get(repo_id)
        token = self._token()
        private = hub.faults.private.get(repo_id)
        if repo is None or (private is not None and token not in private):
            status = 404 if repo is None else 401
            self._error(status, "RepoNotFound", "Repository not found")
            return
        rev = unquote(rest[0])
        commit = repo.resolve(rev)
        if commit is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            return
        files = repo.commits[commit]
        path = unquote("/".join(rest[1:]))
        gated = hub.faults.gated.get(repo_id)
        if kind == "revision":
            if len(rest) != 1:
                self._error(404, "NotFound", f"Sorry, we can't find the page {url.path}")
                return
            self._json(
                200,
                {
                    "_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24],
                    "id": repo_id,
                    "modelId": repo_id,
                    "sha": commit,
                    "private": private is not None,
                    "gated": "auto" if gated is not None else False,
                    "disabled": False,
                    "tags": [],
                    "siblings": [{"rfilename": p} for p in sorted(files)],
                },
            )
        elif kind == "tree":
            recursive = query.get("recursive", ["false"])[-1].lower() in ("true", "1")
            listing = _tree(files, commit, path, recursive)
            if listing is None:
                self._error(404, "EntryNotFound", f"{path} does not exist on {rev}")
                return
            self._json(200, listing)
        else:
            self._resolve(repo_id, commit, files, path, gated, token)

    def _resolve(self, repo_id, commit, files, path, gated, token) -> None:  # type: ignore[no-untyped-def]
        hub = self.server.hub
        faults = hub.faults
        if gated is not None and token not in gated:
            if token is None:
                message = (
                    f"Access to model {repo_id} is restricted. You must have access to it and be "
                    "authenticated to access it. Please log in."
                )
                self._error(401, "GatedRepo", message)
            else:
                message = (
                    f"Access to model {repo_id} is restricted and you are not in the authorized "
                    f"list. Visit {hub.endpoint}/{repo_id} to ask for access."
                )
                self._error(403, "GatedRepo", message)
            return
        commit_header = ("X-Repo-Commit", commit)
        entry = files.get(path)
        if entry is None or path in faults.missing:
            self._error(404, "EntryNotFound", "Entry not found", [commit_header])
            return
        if path in faults.redirect_loop:
            location = hub.endpoint + urlsplit(self.path).path
            self._small(302, [("Location", location), commit_header], b"")
            return
        if not entry.lfs:
            headers = [
                commit_header,
                ("ETag", f'"{entry.git_oid}"'),
                ("Content-Type", "application/octet-stream"),
            ]
            self._serve_bytes(entry.blob, headers)
            return
        life = max(0, int(faults.expire_after))
        expires = math.floor(time.time()) + life
        if faults._first_issue_expired(repo_id, path):
            expires = math.floor(time.time()) - 1
        headers = [
            ("Location", hub.signed_url(entry.sha256, expires)),
            commit_header,
            ("ETag", f'"{entry.git_oid}"'),
            ("X-Linked-Etag", f'"{entry.sha256}"'),
            ("X-Linked-Size", str(entry.blob.size)),
        ]
        self._small(302, headers, b"")

    # -- the CDN --

    def _cdn(self) -> None:
        hub = self.server.hub
        url = urlsplit(self.path)
        m = re.fullmatch(r"/repos/([0-9a-f]{64})", url.path)
        found = hub._by_sha.get(m.group(1)) if m else None
        if m is None or found is None:
            self._xml_error(404, "NoSuchKey", "The specified key does not exist.")
            return
        sha = m.group(1)
        query = parse_qs(url.query)
        try:
            expires = int(query["Expires"][0])
            life = int(query["X-Amz-Expires"][0])
            sig = query["X-Amz-Signature"][0]
        except (KeyError, ValueError, IndexError):
            self._xml_error(403, "AccessDenied", "Query-string authentication requires parameters")
            return
        if not hmac.compare_digest(sig, hub._sign(sha, expires, life)):
            self._xml_error(
                403,
                "SignatureDoesNotMatch",
                "The request signature we calculated does not match the signature you provided.",
            )
            return
        if time.time() >= expires:
            self._xml_error(403, "AccessDenied", "Request has expired")
            return
        blob, paths = found
        faults = hub.faults
        if self.command == "GET" and faults._first_get_fails(paths, self.headers.get("Range")):
            self._xml_error(503, "SlowDown", "Please reduce your request rate.")
            return
        corrupt_at = next((faults.corrupt[p] for p in paths if p in faults.corrupt), None)
        cut = any(p in faults.truncate for p in paths)
        etag = hashlib.md5(sha.encode()).hexdigest()
        headers = [("ETag", f'"{etag}"'), ("Content-Type", "application/octet-stream")]
        self._serve_bytes(blob, headers, corrupt_at, cut)


def _split_repo(
    parts: List[str], kinds: Tuple[str, ...], repos: Mapping[str, Repo]
) -> Tuple[Optional[str], Optional[str], List[str]]:
    """Splits `[org, name, kind, *rest]` or `[name, kind, *rest]`; a registered repo wins."""
    candidates = []
    if len(parts) >= 3 and parts[2] in kinds:
        candidates.append((unquote(parts[0]) + "/" + unquote(parts[1]), parts[2], parts[3:]))
    if len(parts) >= 2 and parts[1] in kinds:
        candidates.append((unquote(parts[0]), parts[1], parts[2:]))
    for repo_id, kind, rest in candidates:
        if repo_id in repos:
            return kind, repo_id, rest
    if candidates:
        repo_id, kind, rest = candidates[0]
        return kind, repo_id, rest
    return None, None, []


def _tree(
    files: Mapping[str, RepoFile], commit: str, under: str, recursive: bool
) -> Optional[List[dict]]:
    under = under.strip("/")
    prefix = under + "/" if under else ""
    dirs: Set[str] = set()
    out: List[dict] = []
    for path in sorted(files):
        if not path.startswith(prefix):
            continue
        rel = path[len(prefix) :].split("/")
        for i in range(1, len(rel)):
            if recursive or i == 1:
                dirs.add(prefix + "/".join(rel[:i]))
        if not recursive and len(rel) > 1:
            continue
        e = files[path]
        item: dict = {"type": "file", "oid": e.git_oid, "size": e.blob.size, "path": path}
        if e.lfs:
            item["lfs"] = {"oid": e.sha256, "size": e.blob.size, "pointerSize": e.pointer_size}
        out.append(item)
    if under and not out and not dirs:
        return None
    for d in sorted(dirs):
        oid = hashlib.sha1(f"tree {commit} {d}".encode()).hexdigest()
        out.append({"type": "directory", "oid": oid, "size": 0, "path": d})
    out.sort(key=lambda item: (item["type"] != "directory", item["path"]))
    return out


def parse_rate(text: str) -> Optional[float]:
    """ "100MB" (decimal), "100MiB", "1.5GB", "800000" (bytes/s); "0"/"none" = unlimited."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([kKmMgG]?)(i?)[bB]?\s*", text)
    if text.strip().lower() in ("none", "unlimited"):
        return None
    if m is None:
        raise ValueError(f"not a rate: {text!r} (say 100MB, 100MiB or a number of bytes)")
    value = float(m.group(1))
    power = " kmg".index(m.group(2).lower() or " ")
    value *= (1024 if m.group(3) else 1000) ** power
    return value or None


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repo", action="append", default=[], metavar="ORG/NAME=DIR")
    parser.add_argument("--rate", default=None, help="bytes per second for all, e.g. 100MB")
    parser.add_argument("--ready-file", type=Path, default=None)
    args = parser.parse_args(argv)
    hub = FakeHub()
    for spec in args.repo:
        repo_id, sep, directory = spec.partition("=")
        if not sep:
            parser.error(f"--repo {spec}: say ORG/NAME=DIR")
        hub.add_repo(repo_id, Path(directory))
    if args.rate is not None:
        hub.set_rate(parse_rate(args.rate))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with hub:
        line = f"HF_ENDPOINT={hub.endpoint}"
        print(line, flush=True)
        if args.ready_file is not None:
            tmp = args.ready_file.with_name(args.ready_file.name + ".tmp")
            tmp.write_text(line + "\n")
            tmp.replace(args.ready_file)
        while not stop.wait(3600):
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
