"""The Python tests' HTTP server for loads from a URL: objects held in memory (path -> bytes)
served on loopback with `HEAD` and ranged `GET` (206 and `Content-Range`; a `GET` without
`Range` is the whole object), each with an `ETag` and a `Last-Modified`; `302 Found` for the
paths redirected, 404 for any other; every request logged (method, path, range,
`Authorization`). And the faults a test sets while a load runs: a delay before every `GET` is
answered (`delay`), and `GET`s never answered, their connection left open until the server is
closed (all of them while `stall` is set, or those `hold` picks).

The Rust suite's `backend_mock::http::RangeServer` serves the Rust tests the same way, with
faults of its own (503s, bodies cut short, replaced objects); this one runs in the test's own
process (or in a child Python: conftest's `STALLING_SERVER`), where a test changes what it
does between two statements.
"""

from __future__ import annotations

import hashlib
import threading
import time
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

# Every object's `Last-Modified`: 2026-01-01T00:00:00Z.
MODIFIED = formatdate(1767225600, usegmt=True)


class Request(NamedTuple):
    """One request the server received."""

    method: str
    # Without the query.
    path: str
    # The bytes asked for, inclusive end as HTTP writes it (an open end as the object's last).
    range: Optional[Tuple[int, int]]
    authorization: Optional[str]


class RangeServer:
    """The server, started on `host` (Linux answers the whole of 127/8: `127.0.0.2` is another
    host); a context manager, closed on leaving."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.objects: Dict[str, bytes] = {}
        self.redirects: Dict[str, str] = {}
        self.log: List[Request] = []
        # Seconds every `GET` waits before it is answered.
        self.delay = 0.0
        # While set, no `GET` is answered.
        self.stall = threading.Event()
        # A `GET` this returns True for is never answered.
        self.hold: Optional[Callable[[Request], bool]] = None
        # Set by `close`: the `GET`s left unanswered end (their connections closed).
        self.released = threading.Event()
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer((host, 0), _handler(self))
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def put(self, path: str, data: bytes) -> None:
        """Serves `data` at `path` (`/dir/model.safetensors`)."""
        self.objects[path] = data

    def put_dir(self, directory: Path, prefix: str = "") -> None:
        """Serves every file of `directory` at `prefix/<name>`."""
        for f in sorted(directory.iterdir()):
            if f.is_file():
                self.put(f"{prefix}/{f.name}", f.read_bytes())

    @property
    def host(self) -> str:
        return str(self.server.server_address[0])

    def url(self, path: str = "") -> str:
        """`http://HOST:PORT` followed by `path`."""
        return f"http://{self.authority}{path}"

    @property
    def authority(self) -> str:
        return f"{self.host}:{self.server.server_address[1]}"

    def requests(self, method: Optional[str] = None) -> List[Request]:
        """The requests so far (of `method` only, when given)."""
        with self._lock:
            return [r for r in self.log if method is None or r.method == method]

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> RangeServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _logged(self, request: Request) -> None:
        with self._lock:
            self.log.append(request)


def _range(header: Optional[str], size: int) -> Optional[Tuple[int, int]]:
    """`bytes=A-B` (or `bytes=A-`) as (A, B), B at most the object's last byte."""
    if not header:
        return None
    a, b = header.split("=", 1)[1].split("-", 1)
    return int(a), min(int(b), size - 1) if b else size - 1


def _handler(server: RangeServer) -> type:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _empty(self, status: int, extra: Tuple[Tuple[str, str], ...] = ()) -> None:
            self.send_response(status)
            for k, v in extra:
                self.send_header(k, v)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _answer(self, body: bool) -> None:
            path = self.path.split("?", 1)[0]
            data = server.objects.get(path)
            asked = self.headers.get("Range")
            request = Request(
                self.command,
                path,
                _range(asked, len(data)) if data is not None else None,
                self.headers.get("Authorization"),
            )
            server._logged(request)
            if path in server.redirects:
                self._empty(302, (("Location", server.redirects[path]),))
                return
            if data is None:
                self._empty(404)
                return
            if body:
                if (server.hold is not None and server.hold(request)) or server.stall.is_set():
                    server.released.wait(600)
                    self.close_connection = True
                    return
                time.sleep(server.delay)
            start, end = request.range or (0, len(data) - 1)
            self.send_response(206 if request.range else 200)
            if request.range:
                self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
            self.send_header("ETag", '"' + hashlib.sha256(data).hexdigest()[:16] + '"')
            self.send_header("Last-Modified", MODIFIED)
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(end - start + 1 if body else len(data)))
            self.end_headers()
            if body:
                self.wfile.write(data[start : end + 1])

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def do_GET(self) -> None:
            self._answer(body=True)

    return Handler
