"""A destination callback that touches its own load (issue 19, item 1).

Each case runs in a child process with a timeout, so a deadlock fails the test instead of
hanging the suite. What each method does when called from inside the load's own destination
callback (documented on `safetensors_staging.stage`):

- `report()`, `backend`, `total_bytes`, `held()` work; the report is the
  one as of the last tensor handed out (the tensor being asked for is not in it yet);
- `close()` works: the load ends there, the tensor being asked for is neither read nor handed
  out, and the iteration stops as after any `close()`;
- `next(it)` (iterating the load from its own callback) raises `StagingError` at once.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import write_safetensors

CHILD = textwrap.dedent(
    r"""
    import gc, json, sys
    import numpy as np
    import safetensors_staging as st

    path, method = sys.argv[1], sys.argv[2]
    seen = []
    it = None

    def destination(name, info):
        entry = {"name": name}
        try:
            if method == "report":
                report = it.report()
                entry["value"] = [report["tensors"], [t["name"] for t in report["tensor_list"]]]
            elif method == "backend":
                entry["value"] = it.backend
            elif method == "total_bytes":
                entry["value"] = it.total_bytes
            elif method == "held":
                entry["value"] = sorted(it.held())
            elif method == "close":
                if name == "b":
                    it.close()
                    entry["value"] = "closed"
            elif method == "next":
                next(it)
                entry["value"] = "returned"
        except Exception as e:
            entry["raised"] = [type(e).__name__, isinstance(e, st.StagingError), str(e)]
        seen.append(entry)
        return None

    it = st.stage(path, backend="host", destination=destination, coalesce_below=0, threads=1)
    got = {}
    error = None
    try:
        for name, tensor in it:
            got[name] = tensor.numpy().tobytes().hex()
    except Exception as e:
        error = [type(e).__name__, str(e)]
    report = it.report()
    del tensor
    gc.collect()
    print(json.dumps({"seen": seen, "got": got, "error": error, "tensors": report["tensors"],
                      "held": it.held()}))
    """
)

SPECS = [("a", "F32", (64,)), ("b", "F32", (1024,)), ("c", "F16", (8, 8))]


def run(tmp_path: Path, method: str) -> dict:
    path = tmp_path / "model.safetensors"
    write_safetensors(path, SPECS)
    try:
        out = subprocess.run(
            [sys.executable, "-c", CHILD, str(path), method],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{method}() from the destination callback hung the load (killed after 60 s)")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def expected_bytes(tmp_path: Path) -> dict:
    contents = write_safetensors(tmp_path / "expected.safetensors", SPECS)
    return {name: data.hex() for name, data in contents.items()}


@pytest.mark.parametrize("method", ["report", "backend", "total_bytes", "held"])
def test_reading_the_load_from_its_callback_works(tmp_path: Path, method: str) -> None:
    result = run(tmp_path, method)
    assert result["error"] is None, result
    assert result["got"] == expected_bytes(tmp_path)
    assert [e["name"] for e in result["seen"]] == ["a", "b", "c"]
    assert all("raised" not in e for e in result["seen"]), result["seen"]
    values = [e["value"] for e in result["seen"]]
    if method == "report":
        # As of the last tensor handed out: the one being asked for is not counted yet.
        assert values == [[0, []], [1, ["a"]], [2, ["a", "b"]]]
    elif method == "backend":
        assert values == ["host"] * 3
    elif method == "total_bytes":
        assert values == [64 * 4 + 1024 * 4 + 64 * 2] * 3
    elif method == "held":
        assert values == [["caller", "device", "host"]] * 3
    else:
        assert all(len(v) == 2 for v in values)
    assert result["held"] == {"device": 0, "host": 0, "caller": 0}


def test_close_from_the_callback_ends_the_load_before_the_tensor_is_read(tmp_path: Path) -> None:
    result = run(tmp_path, "close")
    assert result["error"] is None, result
    # "a" was handed out; "b" asked for the close: neither it nor "c" was read or handed out.
    assert list(result["got"]) == ["a"]
    assert result["got"]["a"] == expected_bytes(tmp_path)["a"]
    assert [e["name"] for e in result["seen"]] == ["a", "b"]
    assert result["seen"][1]["value"] == "closed"
    assert result["tensors"] == 1
    assert result["held"] == {"device": 0, "host": 0, "caller": 0}


def test_iterating_the_load_from_its_own_callback_raises_at_once(tmp_path: Path) -> None:
    result = run(tmp_path, "next")
    raised = result["seen"][0].get("raised")
    assert raised is not None, result
    name, is_staging_error, message = raised
    assert is_staging_error, raised
    assert "destination callback" in message and "next" in message, message
    # The callback went on (returned None): the load itself is unharmed.
    assert result["error"] is None, result
    assert result["got"] == expected_bytes(tmp_path)
