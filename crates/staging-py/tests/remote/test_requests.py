"""What a load of an N-shard checkpoint at a URL asks of the server: the headers and the load go
through one store (one client, one runtime), so no object is asked for its `HEAD` twice, and the
bytes come in ranged GETs. The server is Python's own `http.server` (nothing of this project),
logging every request."""

from __future__ import annotations

import threading
from collections import Counter
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest

import safetensors_staging as st

from conftest import write_sharded


@pytest.fixture()
def served(tmp_path: Path) -> Iterator[Tuple[str, Dict[str, bytes], List[Tuple[str, str]]]]:
    contents = write_sharded(
        tmp_path, [[(f"s{s}.w{i}", "F32", (64, 64)) for i in range(3)] for s in range(4)]
    )
    log: List[Tuple[str, str]] = []
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def file(self) -> bytes | None:
            path = tmp_path / self.path.lstrip("/")
            with lock:
                log.append((self.command, self.path))
            return path.read_bytes() if path.is_file() else None

        def head(self, status: int, length: int, extra: Tuple[Tuple[str, str], ...] = ()) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(length))
            self.send_header("Last-Modified", formatdate(1767225600, usegmt=True))
            self.send_header("ETag", '"v1"')
            for k, v in extra:
                self.send_header(k, v)
            self.end_headers()

        def do_HEAD(self) -> None:
            data = self.file()
            if data is None:
                self.head(404, 0)
            else:
                self.head(200, len(data))

        def do_GET(self) -> None:
            data = self.file()
            if data is None:
                self.head(404, 0)
                return
            if "Range" not in self.headers:
                self.head(200, len(data))
                self.wfile.write(data)
                return
            a, b = self.headers["Range"].split("=")[1].split("-")
            a, b = int(a), min(int(b), len(data) - 1)
            self.head(206, b - a + 1, (("Content-Range", f"bytes {a}-{b}/{len(data)}"),))
            self.wfile.write(data[a : b + 1])

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", contents, log
    finally:
        server.shutdown()


def test_a_url_load_heads_no_object_twice(
    served: Tuple[str, Dict[str, bytes], List[Tuple[str, str]]],
) -> None:
    base, contents, log = served
    got = st.load_file(f"{base}/model.safetensors.index.json", retries=0)
    assert {
        n: bytes(t.contiguous().view(-1).view(__import__("torch").uint8).numpy())
        for n, t in got.items()
    } == contents
    heads = Counter(path for method, path in log if method == "HEAD")
    assert heads, log
    assert max(heads.values()) == 1, heads
    shards = {f"/model-{i:05}-of-00004.safetensors" for i in range(1, 5)}
    assert shards <= set(heads), heads
    # Everything else is a GET (the index whole, then ranges).
    assert {method for method, _ in log} == {"HEAD", "GET"}, log


def test_a_selection_made_from_the_headers_reads_only_what_it_chose(
    served: Tuple[str, Dict[str, bytes], List[Tuple[str, str]]],
) -> None:
    base, contents, log = served
    got = st.load_file(
        f"{base}/model.safetensors.index.json",
        select=lambda name: name.startswith("s2."),
        retries=0,
    )
    assert sorted(got) == ["s2.w0", "s2.w1", "s2.w2"]
    heads = Counter(path for method, path in log if method == "HEAD")
    assert max(heads.values()) == 1, heads
