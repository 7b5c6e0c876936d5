"""Tensors for the CPU from local files are private mappings of the files (`map`, default
`auto`: device "cpu"): the bytes of safetensors, the path the report names, writes that stay
in the process, mappings that outlive the load, the handle and the file's name; NumPy's arrays
are copies unless `map=True` is asked for, as `safetensors.numpy`'s are."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest

import safetensors_staging as st

from conftest import Spec, write_sharded

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")


@pytest.fixture()
def checkpoint(tmp_path: Path) -> Dict[str, bytes]:
    shards: List[List[Spec]] = [
        [("a", "F32", (64, 33)), ("b", "BF16", (7,)), ("empty", "F16", (0, 4))],
        [("c", "I64", (5, 3)), ("d", "U8", (4099,))],
    ]
    return write_sharded(tmp_path, shards, seed=3)


def digests(directory: Path) -> Dict[str, str]:
    return {
        f.name: hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(directory.glob("*.safetensors"))
    }


def reference(directory: Path) -> Dict[str, torch.Tensor]:
    out: Dict[str, torch.Tensor] = {}
    for f in sorted(directory.glob("*.safetensors")):
        out.update(safetensors_torch.load_file(f))
    return out


def test_cpu_loads_are_mappings_with_safetensors_bytes(tmp_path: Path, checkpoint) -> None:
    with st.stage(tmp_path) as it:
        got = dict(it)
        report = it.report()
    want = reference(tmp_path)
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
        # Bytes, not values: random bytes hold NaNs.
        assert got[name].view(torch.uint8).numpy().tobytes() == checkpoint[name], name
        assert tensor.view(torch.uint8).numpy().tobytes() == checkpoint[name], name
    assert {e["path"] for e in report["tensor_list"]} == {"mapped"}
    assert report["paths"]["mapped"] == {"tensors": 5, "bytes": sum(map(len, checkpoint.values()))}
    assert report["mode"] == "mmap" and report["peak_host_bytes"] == 0
    assert it.held() == {"device": 0, "host": 0, "caller": 0}


def test_writes_stay_in_the_process_and_never_reach_the_file(tmp_path: Path, checkpoint) -> None:
    before = digests(tmp_path)
    got = st.load_file(tmp_path)
    got["a"].fill_(7.0)
    got["c"][0, 0] = -1
    assert bool((got["a"] == 7.0).all()) and int(got["c"][0, 0]) == -1
    # Its neighbours in the same mapping are untouched, the files too, and a new load sees them.
    assert bytes(got["b"].view(torch.uint8).numpy()) == checkpoint["b"]
    assert digests(tmp_path) == before
    again = st.load_file(tmp_path)
    assert bytes(again["a"].numpy().tobytes()) == checkpoint["a"]
    assert bytes(again["c"].numpy().tobytes()) == checkpoint["c"]


def test_tensors_outlive_the_handle_the_load_and_the_files_name(tmp_path: Path, checkpoint) -> None:
    with st.safe_open(tmp_path, framework="pt") as f:
        a = f.get_tensor("a")
        d = f.get_slice("d")[10:4000]
        paths = f.report()["paths"]
        # Every read mapped (the handle reads the next tensor ahead: 3 reads, not 2).
        assert paths["mapped"]["tensors"] >= 2
        assert paths["device"]["tensors"] == paths["host"]["tensors"] == 0
    for p in tmp_path.glob("*.safetensors"):
        p.unlink()
    assert a.numpy().tobytes() == checkpoint["a"]
    assert d.numpy().tobytes() == checkpoint["d"][10:4000]


def test_map_false_reads_into_memory_of_our_own(tmp_path: Path, checkpoint) -> None:
    with st.stage(tmp_path, map=False) as it:
        got = dict(it)
        report = it.report()
    assert {e["path"] for e in report["tensor_list"]} == {"device"}
    assert report["paths"]["mapped"]["tensors"] == 0
    assert got["a"].numpy().tobytes() == checkpoint["a"]


def test_numpy_arrays_are_copies_unless_map_is_asked_for(tmp_path: Path, checkpoint) -> None:
    import safetensors_staging.numpy as stn

    with stn.stage(tmp_path, unsupported_dtypes="uint8") as it:
        got = dict(it)
        report = it.report()
    # Memory of the library's own, as `safetensors.numpy`'s arrays are theirs (no mapping).
    assert report["paths"]["mapped"]["tensors"] == 0
    assert {e["path"] for e in report["tensor_list"]} == {"device"}
    assert got["a"].tobytes() == checkpoint["a"]
    assert got["c"].tobytes() == checkpoint["c"]
    assert got["d"].tobytes() == checkpoint["d"]
    got["d"][:] = 0
    assert st.load_file(tmp_path)["d"].numpy().tobytes() == checkpoint["d"]
    assert np.asarray(got["d"]).sum() == 0
    # "auto", torch's mapping default, means a copy here too; only map=True maps.
    with stn.stage(tmp_path, unsupported_dtypes="uint8", map="auto") as it:
        assert it.report()["paths"]["mapped"]["tensors"] == 0 and dict(it)
    with stn.stage(tmp_path, unsupported_dtypes="uint8", map=True) as it:
        mapped = dict(it)
        assert it.report()["paths"]["mapped"]["tensors"] == 5
    assert mapped["d"].tobytes() == checkpoint["d"]


def live_mappings() -> int:
    with open("/proc/self/maps") as maps:
        return sum(1 for _ in maps)


def test_live_numpy_arrays_of_many_files_hold_no_mapping_each(tmp_path: Path) -> None:
    # Each live mapped file is one of the process's `vm.max_map_count` mappings (65,530 by
    # default): ~65,000 small files loaded with their arrays kept would exhaust them, where
    # `safetensors.numpy` loads 70,000. Arrays of their own hold none.
    import safetensors.numpy

    import safetensors_staging.numpy as stn

    files = []
    for i in range(300):
        files.append(tmp_path / f"f{i}.safetensors")
        safetensors.numpy.save_file({"w": np.full(3, i, np.int32)}, files[-1])
    before = live_mappings()
    kept = [stn.load_file(f) for f in files]
    assert live_mappings() - before < 30
    assert [int(k["w"][0]) for k in kept] == list(range(300))
    mapped = [stn.load_file(f, map=True) for f in files]
    assert live_mappings() - before >= 300, "map=True maps each file"
    assert [int(m["w"][2]) for m in mapped] == list(range(300))


LATER_FILE_CHILD = r"""
import json, resource, sys
import torch
import safetensors_staging as st

def address_space():
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmSize:"))
    return int(line.split()[1]) * 1024

# 2 GiB more than the process maps now: room for the load, not for a 64 GiB file's mapping.
resource.setrlimit(resource.RLIMIT_AS, (address_space() + (2 << 30), resource.RLIM_INFINITY))
with st.stage(sys.argv[1], select=sys.argv[2:]) as it:
    got = {name: tensor.view(torch.uint8).numpy().tobytes().hex() for name, tensor in it}
    report = it.report()
print(json.dumps({"got": got, "paths": [e["path"] for e in report["tensor_list"]]}))
"""


def test_a_later_file_the_system_cannot_map_is_read_and_those_before_stay_mapped(
    tmp_path: Path,
) -> None:
    """A load maps its files one at a time as it reaches them (issue 50: mappings bounded
    whatever the number of files). A later file the system has no memory to map (here 64 GiB
    under an address-space limit 2 GiB above the process's) is read into memory of the load's
    own, as an allocation failure falls back, with its bytes exact; the files before it stay
    mapped. When the first file cannot be mapped, the whole load reads, as before."""
    import json
    import struct
    import subprocess
    import sys

    from conftest import write_safetensors

    first = write_safetensors(tmp_path / "model-00001-of-00002.safetensors", [("a", "F32", (4, 3))])
    big, b, c = 64 << 30, bytes(range(7, 23)), bytes(range(100, 108))
    header = {
        "b": {"dtype": "U8", "shape": [16], "data_offsets": [0, 16]},
        "c": {"dtype": "U8", "shape": [8], "data_offsets": [16, 24]},
        "big": {"dtype": "U8", "shape": [big], "data_offsets": [24, 24 + big]},
    }
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(tmp_path / "model-00002-of-00002.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b + c)
        f.truncate(8 + len(text) + 24 + big)  # a hole: nothing on disk
    weight_map = {"a": "model-00001-of-00002.safetensors"}
    weight_map.update(dict.fromkeys(["b", "c", "big"], "model-00002-of-00002.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))

    def load(*names: str) -> Dict[str, object]:
        done = subprocess.run(
            [sys.executable, "-c", LATER_FILE_CHILD, str(tmp_path), *names],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout)

    # Two tensors of the file that cannot be mapped: each read (not mapped together as a run).
    three = load("a", "b", "c")
    assert three["got"] == {"a": first["a"].hex(), "b": b.hex(), "c": c.hex()}
    assert three["paths"] == ["mapped", "host", "host"]
    alone = load("b")
    assert alone["got"] == {"b": b.hex()}
    assert alone["paths"] == ["device"]  # a buffer of the load's own, in host memory
