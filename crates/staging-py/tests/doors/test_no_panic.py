"""Bad input through the public Python API is an exception of the library (or Python's own
`TypeError`/`ValueError`), never `pyo3_runtime.PanicException`: a panic that reaches Python is
a bug. The cases run in a child process (a hang is a failure too, after 120 s)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import write_safetensors

CHILD = textwrap.dedent(
    r"""
    import json, sys
    import safetensors_staging as st
    from safetensors_staging import _native

    good, directory = sys.argv[1], sys.argv[2]
    cases = {
        "empty list": lambda: st.load_file([]),
        "nul in path": lambda: st.load_file("a\x00b"),
        "a directory as a file": lambda: st.load_file([directory, good]),
        "unsupported scheme": lambda: st.load_file("file:///models"),
        "url without a bucket": lambda: st.load_file("s3://", retries=0),
        "nothing listening": lambda: st.load_file("http://127.0.0.1:1/x", retries=0),
        "negative chunk": lambda: st.load_file(good, chunk_size=-1),
        "zero chunk": lambda: st.load_file(good, chunk_size=0),
        "zero staging": lambda: st.load_file(good, staging_size=0),
        "zero threads": lambda: st.load_file(good, threads=0),
        "zero slots": lambda: st.load_file(good, staging_slots=0),
        "zero divisor": lambda: st.load_file(good, headroom_divisor=0),
        "huge cap": lambda: st.load_file(good, memory_cap=1 << 70),
        "huge chunk": lambda: st.load_file(good, chunk_size=1 << 70),
        "negative device": lambda: st.load_file(good, -1),
        "huge device": lambda: st.load_file(good, "cuda:99999999999999999999999"),
        "bool device": lambda: st.load_file(good, True),
        "none backend": lambda: st.load_file(good, backend=None, device="tpu"),
        "empty library path": lambda: st.load_file(good, "cuda:0", cufile_lib=""),
        "reversed rows": lambda: st.load_file(good, rows={"w": (5, 2)}),
        "zero parts": lambda: st.load_file(good, rows={"w": "0/0"}),
        "rank past parts": lambda: st.load_file(good, rows={"w": "3/2"}),
        "rows of a scalar": lambda: st.load_file(good, rows={"s": (0, 1)}),
        "rows past the end": lambda: st.load_file(good, rows={"w": (0, 1 << 62)}),
        "rows not a range": lambda: st.load_file(good, rows={"w": [1, 2, 3]}),
        "rows a list": lambda: st.load_file(good, rows=[("w", (0, 1))]),
        "select ints": lambda: st.load_file(good, select=[1, 2]),
        "select an int": lambda: st.load_file(good, select=5),
        "select a bad glob": lambda: st.load_file(good, select=["w["]),
        "select raises": lambda: st.load_file(good, select=lambda n: 1 / 0),
        "rows raises": lambda: st.load_file(good, rows=lambda n, i: 1 / 0),
        "rows gives junk": lambda: st.load_file(good, rows=lambda n, i: object()),
        "store options not a dict": lambda: st.load_file(good, store_options=[("a", "b")]),
        "store option without a value": lambda: st.load_file("s3://b/k", store_options={"": "x"}, retries=0),
        "zero concurrency": lambda: st.load_file("http://127.0.0.1:1/x", concurrency=0, retries=0),
        "zero range": lambda: st.load_file("http://127.0.0.1:1/x", range_size=0, retries=0),
        "zero bandwidth": lambda: st.load_file("http://127.0.0.1:1/x", bandwidth=0, retries=0),
        "unknown keyword": lambda: st.load_file(good, chunk=1),
        "destination junk": lambda: st.load_file(good, destination=lambda n, i: "junk"),
        "destination too small": lambda: st.load_file(good, destination=lambda n, i: bytearray(1)),
        "plan of zero ranks": lambda: st.open(good).plan(0),
        "plan of negative ranks": lambda: st.open(good).plan(-1),
        "missing key": lambda: st.open(good)["nope"],
        "rows resolved past": lambda: _native._resolve_rows("9/4", 10),
        "rows resolved junk": lambda: _native._resolve_rows(None, 10),
        "unsupported dtypes junk": lambda: st.load_file(good, unsupported_dtypes="maybe"),
        "open with a bad option": lambda: st.open(good, range_size="lots"),
        # The drop-in for safetensors.
        "safe_open a bad framework": lambda: st.safe_open(good, framework=None),
        "safe_open a bad device": lambda: st.safe_open(good, device="cuda:-1"),
        "safe_open select": lambda: st.safe_open(good, select=["w"]),
        "safe_open an unknown keyword": lambda: st.safe_open(good, chunk=1),
        "get_tensor an int": lambda: st.safe_open(good).get_tensor(1),
        "get_slice past the end": lambda: st.safe_open(good).get_slice("w")[1 << 62],
        "get_slice a huge negative": lambda: st.safe_open(good).get_slice("w")[-(1 << 62)],
        "get_slice too many": lambda: st.safe_open(good).get_slice("s")[0],
        "get_slice a float": lambda: st.safe_open(good, framework="np").get_slice("w")[0.5],
        "reader rows reversed": lambda: _native._reader([good]).read("w", (3, 1)),
        "reader rows past the end": lambda: _native._reader([good]).read("w", (0, 1 << 62)),
        "reader rows of a scalar": lambda: _native._reader([good]).read("s", (0, 1)),
        "reader unknown tensor": lambda: _native._reader([good]).read("nope"),
        "reader after close": lambda: (r := _native._reader([good]), r.close(), r.read("w")),
        "parse nothing": lambda: _native._parse(b""),
        "parse junk": lambda: _native._parse(b"\xff" * 64),
        "parse a huge header": lambda: _native._parse((1 << 62).to_bytes(8, "little") + b"{}"),
        "torch load junk": lambda: __import__("safetensors_staging.torch").torch.load(b"\x08" + b"\x00" * 7 + b"{}"),
        "numpy load junk": lambda: __import__("safetensors_staging.numpy").numpy.load(b"junk"),
        "serialize a bad dtype": lambda: _native._serialize(
            [("a", "Q9", [1], __import__("numpy").zeros(4, "uint8"))], None),
        "serialize too few bytes": lambda: _native._serialize(
            [("a", "F32", [4], __import__("numpy").zeros(3, "uint8"))], None),
        "serialize a huge shape": lambda: _native._serialize(
            [("a", "F32", [1 << 62, 1 << 62], __import__("numpy").zeros(4, "uint8"))], None),
        "serialize into a directory": lambda: _native._serialize([], None, directory),
        "serialize metadata junk": lambda: _native._serialize([], {1: 2}),
    }
    results = {}
    for name, case in cases.items():
        try:
            case()
            results[name] = "returned"
        except BaseException as e:  # noqa: BLE001 - what it raised is the point
            results[name] = [type(e).__module__, type(e).__name__, str(e)[:200]]
    print(json.dumps(results))
    """
)

# Python's own, for a wrong type, a missing key, a negative where an unsigned goes, and what the
# caller's own function raised.
ALLOWED = {
    "TypeError",
    "ValueError",
    "KeyError",
    "OverflowError",
    "ZeroDivisionError",
    # A bad index, raised by the framework's own indexing (as safetensors' slices raise it).
    "IndexError",
}


def test_bad_input_never_panics(tmp_path: Path) -> None:
    good = tmp_path / "model.safetensors"
    write_safetensors(good, [("w", "F32", (4, 4)), ("s", "F32", ())])
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(good), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    results = json.loads(out.stdout)
    assert len(results) > 40
    for name, result in results.items():
        # dict() takes a list of pairs, as Python users expect of a mapping argument.
        assert result != "returned" or name in {"rows a list", "store options not a dict"}, (
            name,
            result,
        )
        if result == "returned":
            continue
        module, cls, message = result
        assert "Panic" not in cls and module != "pyo3_runtime", (name, result)
        assert module == "safetensors_staging" or cls in ALLOWED, (name, result)
