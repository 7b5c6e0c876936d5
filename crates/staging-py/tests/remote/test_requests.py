"""What a load of an N-shard checkpoint at a URL asks of the server: the headers and the load go
through one store (one client, one runtime), so no object is asked for its `HEAD` twice, and the
bytes come in ranged GETs. The server is `range_server`'s (Python's own `http.server`, nothing
of this project), logging every request."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Dict, Iterator, Tuple

import pytest
from range_server import RangeServer

import safetensors_staging as st

from conftest import write_sharded


@pytest.fixture()
def served(tmp_path: Path) -> Iterator[Tuple[str, Dict[str, bytes], RangeServer]]:
    contents = write_sharded(
        tmp_path, [[(f"s{s}.w{i}", "F32", (64, 64)) for i in range(3)] for s in range(4)]
    )
    with RangeServer() as server:
        server.put_dir(tmp_path)
        yield server.url(), contents, server


def test_a_url_load_heads_no_object_twice(
    served: Tuple[str, Dict[str, bytes], RangeServer],
) -> None:
    base, contents, server = served
    got = st.load_file(f"{base}/model.safetensors.index.json", retries=0)
    assert {
        n: bytes(t.contiguous().view(-1).view(__import__("torch").uint8).numpy())
        for n, t in got.items()
    } == contents
    heads = Counter(r.path for r in server.requests("HEAD"))
    assert heads, server.log
    assert max(heads.values()) == 1, heads
    shards = {f"/model-{i:05}-of-00004.safetensors" for i in range(1, 5)}
    assert shards <= set(heads), heads
    # Everything else is a GET (the index whole, then ranges).
    assert {r.method for r in server.requests()} == {"HEAD", "GET"}, server.log


def test_a_selection_made_from_the_headers_reads_only_what_it_chose(
    served: Tuple[str, Dict[str, bytes], RangeServer],
) -> None:
    base, contents, server = served
    got = st.load_file(
        f"{base}/model.safetensors.index.json",
        select=lambda name: name.startswith("s2."),
        retries=0,
    )
    assert sorted(got) == ["s2.w0", "s2.w1", "s2.w2"]
    heads = Counter(r.path for r in server.requests("HEAD"))
    assert max(heads.values()) == 1, heads
