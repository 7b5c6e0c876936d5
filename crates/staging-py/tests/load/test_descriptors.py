"""A checkpoint of more shards than the descriptor limit loads through every door, with `map` at
its default: 2,000 shards under a limit of 64 descriptors (the usual soft limit is 1,024; issue
48's case was 256), where a mapped load used to hold one descriptor per shard and failed with
"too many open files". Each door runs in a child process with the limit set; what it read is
checked byte for byte against the files' own bytes (written here in plain Python). The
mappings of the checkpoint's files are counted too (issue 50): a door that hands tensors out
one at a time holds a few whatever the number of files (a reader's handle at most the 256 it
keeps), one that returns them all at most one a file, and none is left once they are dropped."""

from __future__ import annotations

import hashlib
import json
import resource
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from conftest import Spec, write_sharded

SHARDS = 2000
LIMIT = 64
# The mappings a reader's handle keeps (`MAPS_KEPT` in src/loader/mapped.rs).
MAPS_KEPT = 256
SCRIPT = Path(__file__).with_name("many_files_door.py")


@pytest.fixture(scope="module")
def many_shards(tmp_path_factory: pytest.TempPathFactory) -> Tuple[Path, Dict[str, str]]:
    directory = tmp_path_factory.mktemp("many")
    shards: List[List[Spec]] = [
        [(f"s{i}.w", "F32", (4, 3)), (f"s{i}.b", "U8", (7 + i % 5,))] for i in range(SHARDS)
    ]
    contents = write_sharded(directory, shards, seed=11)
    return directory, {name: hashlib.sha256(data).hexdigest() for name, data in contents.items()}


def limited() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))


def under_the_limit(command: List[str]) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, preexec_fn=limited)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.parametrize(
    "door",
    [
        "load_file",
        "load_file-map-false",
        "stage",
        "numpy",
        "safe_open",
        "safe_open-map-false",
        "c",
    ],
)
def test_every_door_loads_more_shards_than_the_descriptor_limit(
    many_shards: Tuple[Path, Dict[str, str]], other_doors: Tuple[Path, Path], door: str
) -> None:
    if door != "numpy":
        pytest.importorskip("torch")
    directory, want = many_shards
    command = [sys.executable, str(SCRIPT), door, str(directory)]
    if door == "c":
        command.append(str(other_doors[1]))
    lines = under_the_limit(command).splitlines()
    *tensors, most_mapped, left, most = lines
    assert dict(line.split() for line in tensors) == want
    # Every descriptor of the process, Python's own included, stayed under the limit.
    assert most.startswith("most descriptors ") and int(most.split()[-1]) < LIMIT
    # Mappings: one a file at most while every tensor is alive (`load_file` returns them all);
    # a few where each is dropped before the next (a streaming load maps its files one at a
    # time as it reaches them); a handle keeps at most 256.
    assert most_mapped.startswith("most mappings ") and left == "mappings left 0"
    mapped = int(most_mapped.split()[-1])
    if door == "load_file":
        assert mapped == SHARDS
    elif door in ("safe_open", "c", "stage"):
        assert 0 < mapped <= (MAPS_KEPT if door == "safe_open" else 4), mapped
    else:
        assert mapped == 0, (door, mapped)


@pytest.mark.parametrize(("device", "path"), [("auto", "device"), ("cpu", "mapped")])
def test_the_stage_command_loads_more_shards_than_the_descriptor_limit(
    many_shards: Tuple[Path, Dict[str, str]], stage_bin: Path, device: str, path: str
) -> None:
    # With no GPU, `auto` reads into memory of the library's own; `cpu` maps the files.
    directory, want = many_shards
    command = [str(stage_bin), str(directory), "--device", device, "--json"]
    report = json.loads(under_the_limit(command))
    assert report["tensors"] == len(want) and report["files"] == SHARDS
    assert report["paths"][path]["tensors"] == len(want)
