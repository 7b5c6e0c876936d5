"""Loads through the Python package, compared byte for byte with `safetensors` itself or with the
bytes written; the path each tensor took; what the report says."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy
import safetensors.torch
import torch

import safetensors_staging as st
import safetensors_staging.numpy as stn
from safetensors_staging import _native

from conftest import BITS, every_dtype_specs, write_safetensors, write_sharded

TORCH_DTYPES = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "F8_E5M2": torch.float8_e5m2,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E8M0": torch.float8_e8m0fnu,
    "F8_E4M3FNUZ": torch.float8_e4m3fnuz,
    "F8_E5M2FNUZ": torch.float8_e5m2fnuz,
    "I16": torch.int16,
    "U16": torch.uint16,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I32": torch.int32,
    "U32": torch.uint32,
    "F32": torch.float32,
    "C64": torch.complex64,
    "F64": torch.float64,
    "I64": torch.int64,
    "U64": torch.uint64,
    "F4": torch.float4_e2m1fn_x2,
}


def torch_bytes(t: torch.Tensor) -> bytes:
    """A tensor's bytes, whatever its dtype."""
    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def assert_same_tensors(got: dict, want: dict) -> None:
    assert list(got) == list(want) or set(got) == set(want)
    for name, expected in want.items():
        tensor = got[name]
        assert tensor.dtype == expected.dtype, name
        assert tuple(tensor.shape) == tuple(expected.shape), name
        assert torch_bytes(tensor) == torch_bytes(expected), name


@pytest.mark.parametrize(
    "options, path",
    [
        # Device cpu: mappings of the file (the page cache is their memory).
        ({}, "mapped"),
        ({"backend": "host"}, "mapped"),
        # Our own memory: mappings turned off, the host standing for a device (auto), or a cap.
        ({"map": False}, "device"),
        ({"backend": "host", "device": "auto"}, "device"),
        ({"memory_cap": 1 << 20}, "host"),
        ({"backend": "host", "device": "auto", "memory_cap": 1 << 20}, "host"),
        ({"threads": 1, "suballocate": False, "chunk_size": 1 << 20, "map": False}, "device"),
    ],
)
def test_minilm_byte_exact_against_safetensors_torch(
    minilm_dir: Path, options: dict, path: str
) -> None:
    want = safetensors.torch.load_file(minilm_dir / "model.safetensors")
    with st.stage(minilm_dir, **options) as it:
        got = dict(it)
        report = it.report()
    assert_same_tensors(got, want)
    assert all(t.device.type == "cpu" for t in got.values())
    # The path each tensor took: all on the device path, or (under a cap) the large ones on the
    # host path; the report agrees with the per-tensor list.
    paths = {entry["name"]: entry["path"] for entry in report["tensor_list"]}
    assert len(paths) == len(want) == report["tensors"]
    if path in ("device", "mapped"):
        assert set(paths.values()) == {path}
        assert report["paths"][path]["tensors"] == len(want)
        assert report["mode"] == ("mmap" if path == "mapped" else "posix")
        assert report["peak_host_bytes"] == 0
        assert report["fallbacks"]["insufficient_memory"] == 0
    else:
        assert "host" in set(paths.values())
        assert report["paths"]["host"]["tensors"] == list(paths.values()).count("host")
        assert report["fallbacks"]["insufficient_memory"] >= report["paths"]["host"]["tensors"]
    assert report["bytes_read"] == report["bytes"] == sum(t.nbytes for t in want.values())
    del got
    assert it.held() == {"device": 0, "host": 0, "caller": 0}


def test_minilm_numpy_byte_exact(minilm_dir: Path) -> None:
    want = safetensors.numpy.load_file(str(minilm_dir / "model.safetensors"))
    got = stn.load_file(minilm_dir)
    assert set(got) == set(want)
    for name, expected in want.items():
        assert isinstance(got[name], np.ndarray)
        assert got[name].dtype == expected.dtype and got[name].shape == expected.shape, name
        assert got[name].tobytes() == expected.tobytes(), name


@pytest.mark.parametrize("memory_cap", [None, 1 << 20])
def test_every_dtype_torch(tmp_path: Path, memory_cap: int | None) -> None:
    """Every dtype of the format, on the device path and (a 1 MiB cap, under the 256 MiB
    headroom) the host path: the bytes written, under the torch dtype safetensors maps it to; F6
    and an F4 tensor whose last dimension is not whole bytes come as uint8 when asked, and raise
    otherwise."""
    contents = write_safetensors(tmp_path / "model.safetensors", every_dtype_specs(), seed=3)
    with pytest.raises(st.UnsupportedDtypeError, match="F6_E2M3"):
        st.load_file(tmp_path, memory_cap=memory_cap)
    with st.stage(tmp_path, memory_cap=memory_cap, unsupported_dtypes="uint8") as it:
        got = dict(it)
        report = it.report()
    expected_path = "mapped" if memory_cap is None else "host"
    assert {e["path"] for e in report["tensor_list"] if e["bytes"]} == {expected_path}
    for name, dtype, shape in every_dtype_specs():
        tensor = got[name]
        assert torch_bytes(tensor) == contents[name], name
        if dtype in ("F6_E2M3", "F6_E3M2") or name == "odd.F4":
            assert tensor.dtype == torch.uint8, name
            last = shape[-1] * BITS[dtype]
            want_shape = [*shape[:-1], last // 8] if last % 8 == 0 else [len(contents[name])]
            assert list(tensor.shape) == want_shape, name
        elif dtype == "F4":
            assert tensor.dtype == torch.float4_e2m1fn_x2
            assert list(tensor.shape) == [*shape[:-1], shape[-1] // 2]
        else:
            assert tensor.dtype == TORCH_DTYPES[dtype], name
            assert tuple(tensor.shape) == tuple(shape), name


def test_every_dtype_against_safetensors(tmp_path: Path) -> None:
    """The dtypes `safetensors` itself loads, compared with it, through torch and NumPy."""
    specs = [s for s in every_dtype_specs() if s[1] in safetensors.torch._TYPES]
    write_safetensors(tmp_path / "model.safetensors", specs, seed=5)
    assert_same_tensors(
        st.load_file(tmp_path), safetensors.torch.load_file(tmp_path / "model.safetensors")
    )
    specs = [s for s in specs if s[1] in safetensors.numpy._TYPES]
    write_safetensors(tmp_path / "model.safetensors", specs, seed=6)
    want = safetensors.numpy.load_file(str(tmp_path / "model.safetensors"))
    got = stn.load_file(tmp_path)
    for name, expected in want.items():
        assert got[name].dtype == expected.dtype and got[name].shape == expected.shape, name
        assert got[name].tobytes() == expected.tobytes(), name


def test_numpy_dtypes_it_lacks(tmp_path: Path) -> None:
    # F8 first: NumPy has no dtype for it whatever is imported (BF16 loads as
    # `ml_dtypes.bfloat16` once ml_dtypes is imported, as with `safetensors.numpy`).
    contents = write_safetensors(
        tmp_path / "model.safetensors",
        [("f", "F8_E4M3", (4,)), ("b", "BF16", (2, 3)), ("s", "F32", (2,))],
    )
    with pytest.raises(st.UnsupportedDtypeError, match="F8_E4M3"):
        stn.load_file(tmp_path)
    got = stn.load_file(tmp_path, unsupported_dtypes="uint8")
    assert got["b"].dtype == np.uint8 and got["b"].shape == (2, 6)
    assert got["b"].tobytes() == contents["b"]
    assert got["f"].dtype == np.uint8 and got["f"].shape == (4,)
    assert got["s"].dtype == np.float32 and got["s"].tobytes() == contents["s"]


def test_sharded_and_hub_cache(tmp_path: Path) -> None:
    """A sharded checkpoint by its directory, and a Hugging Face hub-cache snapshot (every file
    a relative symlink into blobs/)."""
    shards = [[("a", "F32", (64, 8)), ("b", "BF16", (3,))], [("c", "I64", (5, 2))]]
    snapshot = tmp_path / "hub" / "models--org--name" / "snapshots" / "abc123"
    contents = write_sharded(snapshot, shards, seed=9)
    blobs = tmp_path / "hub" / "models--org--name" / "blobs"
    blobs.mkdir()
    for i, f in enumerate(sorted(snapshot.iterdir())):
        f.rename(blobs / f"blob{i}")
        f.symlink_to(Path("../../blobs") / f"blob{i}")
    got = st.load_file(snapshot)
    assert list(got) == ["a", "b", "c"]
    for name, data in contents.items():
        assert torch_bytes(got[name]) == data
    one = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, safetensors_staging as s; print(len(s.load_file(sys.argv[1])))",
            str(snapshot),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert one.stdout.strip() == "3"


def test_selection_and_rows(minilm_dir: Path) -> None:
    want = safetensors.torch.load_file(minilm_dir / "model.safetensors")
    names = ["embeddings.word_embeddings.weight", "pooler.dense.bias"]
    with st.stage(minilm_dir, select=names) as it:
        got = dict(it)
        assert it.report()["bytes_read"] == sum(want[n].nbytes for n in names)
    assert list(got) == [n for n in want if n in names]
    assert_same_tensors(got, {n: want[n] for n in names})

    got = st.load_file(minilm_dir, select=lambda name: name.endswith(".bias"))
    assert set(got) == {n for n in want if n.endswith(".bias")}

    word = "embeddings.word_embeddings.weight"
    rows = {
        word: (100, 200),
        "encoder.layer.0.attention.self.query.weight": "1/3",
        "pooler.dense.weight": "5:9",
    }
    with st.stage(minilm_dir, select=list(rows), rows=rows) as it:
        got = dict(it)
        report = it.report()
    assert torch.equal(got[word], want[word][100:200])
    query = want["encoder.layer.0.attention.self.query.weight"]
    part = np.array_split(np.arange(query.shape[0]), 3)[1]
    assert torch.equal(
        got["encoder.layer.0.attention.self.query.weight"], query[part[0] : part[-1] + 1]
    )
    assert torch.equal(got["pooler.dense.weight"], want["pooler.dense.weight"][5:9])
    assert report["bytes_read"] == sum(t.nbytes for t in got.values())
    assert {e["name"]: e["rows"] for e in report["tensor_list"]}[word] == [100, 200]

    got = st.load_file(minilm_dir, select=[word], rows=lambda name, info: (0, info.shape[0] // 2))
    assert torch.equal(got[word], want[word][: want[word].shape[0] // 2])

    with pytest.raises(st.SelectionError, match="no.such"):
        st.load_file(minilm_dir, select=["no.such.tensor"])
    with pytest.raises(st.SelectionError, match="rows"):
        st.load_file(minilm_dir, select=[word], rows={word: (0, 10**9)})
    with pytest.raises(ValueError, match="START:END"):
        st.load_file(minilm_dir, select=[word], rows={word: "lots"})


def test_destination_fills_preallocated_tensors(minilm_dir: Path) -> None:
    want = safetensors.torch.load_file(minilm_dir / "model.safetensors")
    given = {}

    def destination(name: str, info: st.TensorInfo):
        if not name.startswith("encoder.layer.0."):
            return None
        given[name] = torch.empty(info.shape, dtype=want[name].dtype)
        assert info.nbytes == want[name].nbytes and info.dtype == "F32"
        return given[name]

    with st.stage(minilm_dir, destination=destination) as it:
        got = dict(it)
        report = it.report()
    assert given and report["paths"]["destination"]["tensors"] == len(given)
    for name, tensor in given.items():
        assert got[name] is tensor  # the caller's own tensor, filled
    assert_same_tensors(got, want)
    paths = {e["name"]: e["path"] for e in report["tensor_list"]}
    assert {paths[n] for n in given} == {"destination"}

    # A NumPy array works as well.
    arrays = {}

    def into_numpy(name: str, info: st.TensorInfo):
        arrays[name] = np.empty(info.nbytes, dtype=np.uint8)
        return arrays[name]

    got = stn.load_file(minilm_dir, select=["pooler.dense.bias"], destination=into_numpy)
    assert got["pooler.dense.bias"] is arrays["pooler.dense.bias"]
    assert got["pooler.dense.bias"].tobytes() == torch_bytes(want["pooler.dense.bias"])


def test_destination_errors(minilm_dir: Path) -> None:
    name = "pooler.dense.bias"
    with pytest.raises(st.DestinationError, match="holds 4"):
        st.load_file(minilm_dir, select=[name], destination=lambda n, i: torch.empty(1))
    with pytest.raises(st.DestinationError, match="not contiguous"):
        st.load_file(minilm_dir, select=[name], destination=lambda n, i: torch.empty(384, 2)[:, 0])
    with pytest.raises(st.DestinationError, match="expected a torch.Tensor"):
        st.load_file(minilm_dir, select=[name], destination=lambda n, i: bytearray(2000))
    # Checked in Rust, through DLPack: a read-only array, and no bare addresses from Python.
    frozen = np.zeros(4000, dtype=np.uint8)
    frozen.flags.writeable = False
    with pytest.raises(st.DestinationError, match="read-only"):
        st.load_file(minilm_dir, select=[name], destination=lambda n, i: frozen)
    assert not frozen.any(), "nothing was written into it"
    with pytest.raises(st.DestinationError, match="does not export DLPack"):
        st.load_file(
            minilm_dir,
            select=[name],
            destination=lambda n, i: (frozen.ctypes.data, frozen.nbytes, frozen),
        )
    with pytest.raises(st.DestinationError, match="does not export DLPack"):
        list(
            _native._stage(
                [str(minilm_dir)], select=[name], destination=lambda n, i: frozen.ctypes.data
            )
        )

    def fails(n, i):
        raise ValueError("no room")

    with pytest.raises(st.DestinationError, match="destination failed") as caught:
        st.load_file(minilm_dir, select=[name], destination=fails)
    assert isinstance(caught.value.__cause__, ValueError)


def test_report_has_the_keys_of_stage_json(minilm_dir: Path, stage_bin: Path) -> None:
    cli = json.loads(
        subprocess.run(
            [str(stage_bin), str(minilm_dir), "--backend", "host", "--json"],
            capture_output=True,
            check=True,
        ).stdout
    )
    with st.stage(minilm_dir) as it:
        for _ in it:
            pass
        report = it.report()
    assert sorted(report) == sorted(cli)
    assert sorted(report["tensor_list"][0]) == sorted(cli["tensor_list"][0])
    assert [e["name"] for e in report["tensor_list"]] == [e["name"] for e in cli["tensor_list"]]
    assert (
        report["bytes_read"] == cli["bytes_read"] and report["backend"] == cli["backend"] == "host"
    )


def test_open_metadata_without_loading(minilm_dir: Path, tmp_path: Path) -> None:
    with st.open(minilm_dir) as ckpt:
        assert len(ckpt) == 104 and "pooler.dense.weight" in ckpt
        info = ckpt["pooler.dense.weight"]
        assert (info.dtype, info.shape, info.nbytes) == ("F32", [384, 384], 384 * 384 * 4)
        assert info.file == minilm_dir / "model.safetensors"
        assert ckpt.files == [minilm_dir / "model.safetensors"]
        assert ckpt.metadata() == {"format": "pt"}
        assert ckpt.keys() == list(ckpt)
        assert ckpt.total_bytes == sum(i.nbytes for i in ckpt.tensors())
    with pytest.raises(KeyError):
        ckpt["nope"]
    write_safetensors(tmp_path / "model.safetensors", [("x", "F16", (2,))], metadata={"k": "v"})
    assert st.open(tmp_path / "model.safetensors").metadata() == {"k": "v"}


def test_device_arguments(minilm_dir: Path) -> None:
    with pytest.raises(ValueError, match="backend cufile cannot load onto device cpu"):
        st.load_file(minilm_dir, backend="cufile")
    with pytest.raises(ValueError, match="host memory"):
        st.load_file(minilm_dir, "cuda:0", backend="host")
    with pytest.raises(ValueError, match="device="):
        st.load_file(minilm_dir, "tpu")
    with pytest.raises(ValueError, match="backend="):
        st.load_file(minilm_dir, backend="nvme")
    if torch.cuda.is_available():
        got = st.load_file(minilm_dir, "cuda:0", select=["pooler.dense.bias"])
        assert got["pooler.dense.bias"].device == torch.device("cuda:0")
    else:
        # No GPU here: auto tries cuFile and hipFile; `details` says why each was passed over.
        with pytest.raises(st.BackendUnavailableError, match="^device cuda:0: no usable GPU: "):
            st.load_file(minilm_dir, torch.device("cuda", 0))


def gpu_runtime() -> bool:
    """Whether the NVIDIA driver's library or the HIP runtime (what the cuFile and hipFile
    backends load first) loads here."""
    import ctypes

    for name in ("libcuda.so.1", "libcuda.so", "libamdhip64.so", "libamdhip64.so.7"):
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            pass
    return False


@pytest.mark.skipif(gpu_runtime(), reason="a GPU driver or runtime is installed here")
def test_no_gpu_is_one_line_and_details_name_each_backend(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    write_safetensors(path, [("w", "F32", (2, 2))])
    with pytest.raises(st.BackendUnavailableError) as caught:
        st.load_file(path, device="cuda:0")
    error = caught.value
    assert str(error) == "device cuda:0: no usable GPU: NVIDIA driver not found"
    assert error.kind == "backend-unavailable"
    assert isinstance(error, st.StagingError) and isinstance(error, safetensors.SafetensorError)
    cufile, hipfile = error.details
    assert cufile == (
        "cufile: no CUDA driver: libcuda.so could not be loaded (is the NVIDIA driver installed?)"
    )
    assert hipfile.startswith("hipfile: no HIP runtime: libamdhip64.so: "), hipfile
    assert hipfile.endswith("(is ROCm installed?)"), hipfile
    # The same through safe_open, safetensors' door.
    with pytest.raises(st.BackendUnavailableError) as caught:
        st.safe_open(path, framework="pt", device="cuda:0")
    assert (str(caught.value), caught.value.details) == (str(error), error.details)


def test_threads_load_separately(minilm_dir: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    want = safetensors.torch.load_file(minilm_dir / "model.safetensors")
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: st.load_file(minilm_dir), range(8)))
    for got in results:
        assert_same_tensors(got, want)
