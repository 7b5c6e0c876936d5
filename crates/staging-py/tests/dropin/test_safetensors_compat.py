"""The drop-in for `safetensors` (issue 21), against the real `safetensors` package on the same
files: `safe_open` (keys, metadata, tensors, slices, errors), the `torch`, `numpy` and `flax`
modules (load, save byte for byte, shared tensors, checks), and `transformers`' own loading path
with `safe_open` swapped for ours."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

import numpy as np
import pytest
import safetensors
import safetensors.numpy
import safetensors.torch
import torch

import safetensors_staging as st
import safetensors_staging.numpy
import safetensors_staging.torch

from conftest import every_dtype_specs, write_safetensors, write_sharded


def torch_tensors() -> Dict[str, torch.Tensor]:
    """Every dtype torch and safetensors share, plus scalars, empty and zero-length tensors."""
    g = torch.Generator().manual_seed(3)
    out: Dict[str, torch.Tensor] = {}
    for dtype in (
        torch.float64,
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
        torch.complex64,
        torch.uint16,
        torch.uint32,
        torch.uint64,
    ):
        raw = torch.randint(
            0,
            256,
            (5, 6, 8 * torch.empty((), dtype=dtype).element_size()),
            generator=g,
            dtype=torch.uint8,
        )
        value = raw.view(dtype)
        if dtype == torch.bool:
            value = (raw[..., :8] & 1).bool()
        out[f"w.{str(dtype).split('.')[-1]}"] = value
    for dtype in (
        torch.float8_e4m3fn,
        torch.float8_e5m2,
        torch.float8_e8m0fnu,
        torch.float4_e2m1fn_x2,
    ):
        out[f"w.{str(dtype).split('.')[-1]}"] = torch.randint(
            0, 256, (4, 6), generator=g, dtype=torch.uint8
        ).view(dtype)
    out["scalar"] = torch.tensor(1.25)
    out["empty"] = torch.zeros(0)
    out["zero_dim"] = torch.zeros(3, 0, 2, dtype=torch.bfloat16)
    out["row"] = torch.arange(40, dtype=torch.float32).reshape(8, 5)
    return out


def same(a: Any, b: Any) -> None:
    """Equal dtype, shape, device and bytes (NaNs included)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)
        assert (a.dtype, tuple(a.shape), a.device) == (b.dtype, tuple(b.shape), b.device)
        if a.numel():
            assert torch.equal(
                a.contiguous().reshape(-1).view(torch.uint8),
                b.contiguous().reshape(-1).view(torch.uint8),
            )
    else:
        a, b = np.asarray(a), np.asarray(b)
        assert (a.dtype, a.shape) == (b.dtype, b.shape)
        assert a.tobytes() == b.tobytes()


def outcome(call: Callable[[], Any]) -> Any:
    try:
        return ("ok", call())
    except Exception as e:  # noqa: BLE001 - the exception is what is compared
        return ("raised", e)


@pytest.fixture(scope="module")
def pt_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("compat") / "model.safetensors"
    safetensors.torch.save_file(torch_tensors(), path, metadata={"format": "pt", "note": "x"})
    return path


def test_safe_open_agrees_with_safetensors(pt_file: Path) -> None:
    with (
        safetensors.safe_open(pt_file, framework="pt") as theirs,
        st.safe_open(pt_file, framework="pt") as ours,
    ):
        assert ours.keys() == theirs.keys()
        assert ours.offset_keys() == theirs.offset_keys()
        assert ours.metadata() == theirs.metadata()
        for name in theirs.keys():
            same(ours.get_tensor(name), theirs.get_tensor(name))
            a, b = ours.get_slice(name), theirs.get_slice(name)
            assert (a.get_shape(), a.get_dtype()) == (b.get_shape(), b.get_dtype()), name
        # Sorted names run in file order here and there, where the next tensor was read ahead
        # (a few read twice).
        assert ours.report()["tensors"] >= len(theirs.keys())


def test_get_tensor_in_file_order_reads_ahead_and_each_tensor_once(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    tensors = {f"t{i:02}": torch.full((1000 + i,), float(i)) for i in range(12)}
    safetensors.torch.save_file(tensors, path)
    total = sum(t.nbytes for t in tensors.values())
    # Read into memory of our own (map=False): a handle that maps reads nothing ahead (below).
    with st.safe_open(path, framework="pt", map=False) as f:
        order = f.offset_keys()
        first = f.get_tensor(order[0])
        # The next one is read ahead while the caller holds the first.
        deadline = time.monotonic() + 10
        while f.report()["tensors"] < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert f.report()["tensors"] == 2
        got = {order[0]: first, **{name: f.get_tensor(name) for name in order[1:]}}
        report = f.report()
        assert (report["tensors"], report["bytes_read"]) == (12, total), "each read once"
    for name, value in tensors.items():
        same(got[name], value)
    # Backwards (no two names in file order): no read ahead at all.
    with st.safe_open(path, framework="pt", map=False) as f:
        for name in reversed(order):
            same(f.get_tensor(name), tensors[name])
        assert (f.report()["tensors"], f.bytes_read) == (12, total)
    # A read ahead not asked for is dropped, and closing waits for it: nothing is left open.
    with st.safe_open(path, framework="pt", map=False) as f:
        f.get_tensor(order[0])
        same(f.get_tensor(order[5]), tensors[order[5]])
    with pytest.raises(st.SafetensorError, match="File is closed"):
        f.get_tensor(order[1])


def test_a_handle_that_maps_reads_nothing_ahead(tmp_path: Path) -> None:
    """Tensors handed out as mappings of a cached file cost microseconds each: a handle that
    maps reads each tensor when asked, in file order too, and starts no read-ahead thread."""
    path = tmp_path / "model.safetensors"
    tensors = {f"t{i:02}": torch.full((1000 + i,), float(i)) for i in range(12)}
    safetensors.torch.save_file(tensors, path)
    before = {t.name for t in threading.enumerate()}
    with st.safe_open(path, framework="pt") as f:
        order = f.offset_keys()
        got = {}
        for i, name in enumerate(order):
            got[name] = f.get_tensor(name)
            assert f.report()["tensors"] == i + 1, "only the tensors asked for were read"
            started = {t.name for t in threading.enumerate()} - before
            assert not any(n.startswith("safe_open-read-ahead") for n in started), started
        assert f.report()["paths"]["mapped"]["tensors"] == 12
    for name, value in tensors.items():
        same(got[name], value)


SLICES: List[Any] = [
    slice(None),
    0,
    -1,
    slice(2, 5),
    slice(-3, None),
    slice(1, 7, 2),
    slice(6, 2),
    slice(-100, 100),
    (slice(None), 1),
    (slice(None), slice(1, 3)),
    (1, slice(None, None, 2)),
    (Ellipsis, 2),
    (Ellipsis, slice(1, 4)),
    Ellipsis,
    (),
    None,
    (None, 2),
    (2, None),
    (Ellipsis, Ellipsis),
    (0, 0),
    (slice(1, 3), [0, 2]),
    # Errors: out of bounds, too many indices, a step that is not positive, a bad type.
    8,
    -9,
    (0, 0, 0),
    slice(None, None, -1),
    slice(None, None, 0),
    1.5,
    "x",
]


@pytest.mark.parametrize("key", SLICES, ids=repr)
def test_slices_agree_with_safetensors_and_read_only_their_rows(pt_file: Path, key: Any) -> None:
    with (
        safetensors.safe_open(pt_file, framework="pt") as theirs,
        st.safe_open(pt_file, framework="pt") as ours,
    ):
        want = outcome(lambda: theirs.get_slice("row")[key])
        before = ours.bytes_read
        got = outcome(lambda: ours.get_slice("row")[key])
        read = ours.bytes_read - before
    assert got[0] == want[0], (got, want)
    if want[0] == "raised":
        assert type(got[1]) is type(want[1]) and str(got[1]) == str(want[1])
        assert read == 0, "nothing is read for an index that cannot be taken"
        return
    same(got[1], want[1])
    # What was read: of the rows of dimension 0 from the first to the last the index touches,
    # the columns from the first to the last it touches (an element is 4 bytes), found by
    # indexing tensors of row and of column numbers the same way. An index with a list
    # (advanced indexing) reads the whole tensor.
    rows = torch.arange(8).reshape(8, 1).expand(8, 5)[key]
    columns = torch.arange(5).reshape(1, 5).expand(8, 5)[key]

    def span(touched: torch.Tensor) -> int:
        return int(touched.max()) - int(touched.min()) + 1

    expected = 0 if rows.numel() == 0 else span(rows) * span(columns) * 4
    advanced = isinstance(key, tuple) and any(isinstance(k, list) for k in key)
    assert read == (8 * 20 if advanced else expected), (key, read, expected)


def test_slicing_reads_the_rows_and_columns_it_needs_of_a_big_tensor(tmp_path: Path) -> None:
    path = tmp_path / "big.safetensors"
    weight = torch.randn(4096, 256)
    safetensors.torch.save_file({"w": weight}, path)
    row = 256 * 4
    with (
        st.safe_open(path, framework="pt") as f,
        safetensors.safe_open(path, framework="pt") as theirs,
    ):
        parts = [f.get_slice("w")[i * 1024 : (i + 1) * 1024] for i in range(4)]
        assert f.bytes_read == 4096 * row  # four quarters, each read once
        assert torch.equal(torch.cat(parts), weight)
        before = f.bytes_read
        column_block = f.get_slice("w")[:, 64:128]  # an inner dimension: its columns only
        assert f.bytes_read - before == 4096 * 64 * 4
        assert torch.equal(column_block, weight[:, 64:128])
        # A view of the file's mapping, as safetensors gives: the same strides, not contiguous.
        want = theirs.get_slice("w")[:, 64:128]
        assert (column_block.stride(), column_block.is_contiguous()) == (
            want.stride(),
            want.is_contiguous(),
        )
        # A tensor-parallel split of the columns in four: each column read once.
        before = f.bytes_read
        shares = [f.get_slice("w")[:, i * 64 : (i + 1) * 64] for i in range(4)]
        assert f.bytes_read - before == 4096 * row
        assert torch.equal(torch.cat(shares, dim=1), weight)
        before = f.bytes_read
        assert torch.equal(f.get_slice("w")[100, 3:9], weight[100, 3:9])
        assert f.bytes_read - before == 6 * 4  # six elements of one row
        report = f.report()
        assert report["tensors"] == 10 and report["read_requests"] >= 10
        assert report["paths"]["mapped"]["tensors"] == 10
    # NumPy's slices are compact copies: the columns alone, copied out of the mapping.
    with st.safe_open(path, framework="np") as f:
        block = f.get_slice("w")[:, 64:128]
        assert block.flags["C_CONTIGUOUS"] and block.nbytes == 4096 * 64 * 4
        assert np.array_equal(block, weight[:, 64:128].numpy())
        assert f.bytes_read == 4096 * 64 * 4
        assert f.report()["paths"]["host"] == {"tensors": 1, "bytes": 4096 * 64 * 4}
    # Where the handle reads into memory of its own (as on a GPU), every row is read whole
    # and the columns copied out of them (a compact tensor: the rows are let go).
    with st.safe_open(path, framework="pt", map=False) as f:
        block = f.get_slice("w")[:, 64:128]
        assert torch.equal(block, weight[:, 64:128])
        assert block.is_contiguous() and block.untyped_storage().nbytes() == 4096 * 64 * 4
        assert f.bytes_read == 4096 * row


@pytest.mark.parametrize("framework", ["np", "numpy", "flax", "jax"])
def test_numpy_and_flax_frameworks_agree(pt_file: Path, framework: str) -> None:
    theirs_framework = {"numpy": "np", "jax": "flax"}.get(framework, framework)
    reference = safetensors.torch.load_file(pt_file)
    with (
        safetensors.safe_open(pt_file, framework=theirs_framework) as theirs,
        st.safe_open(pt_file, framework=framework) as ours,
    ):
        for name in theirs.keys():
            want = outcome(lambda: theirs.get_tensor(name))
            got = outcome(lambda: ours.get_tensor(name))
            if want[0] == "raised":
                # NumPy has no bfloat16 or float8: safetensors raises NumPy's TypeError,
                # this package an UnsupportedDtypeError, which is a TypeError.
                # (For F4 safetensors fails on its own lookup, an AttributeError.) JAX has
                # float8 through ml_dtypes, which safetensors' flax does not use: there, this
                # package gives the tensor, with the file's bytes.
                if got[0] == "ok" and theirs_framework == "flax":
                    raw = reference[name].contiguous().reshape(-1).view(torch.uint8).numpy()
                    assert np.asarray(got[1]).tobytes() == raw.tobytes(), name
                    continue
                assert got[0] == "raised" and isinstance(got[1], TypeError), (name, got)
                continue
            assert got[0] == "ok", (name, got)
            assert type(got[1]) is type(want[1]), name
            same(got[1], want[1])
            # Slices follow safetensors' own slicing of NumPy and Flax tensors, which is
            # stricter than NumPy's: where it refuses a slice NumPy takes (a stop past the end,
            # a negative start, any index of an empty tensor, a list) the same error, in its
            # words; where it answers, the same values.
            for key in (
                slice(1, 3),
                slice(-2, None),
                slice(0, 100),
                (Ellipsis, 0),
                0,
                -1,
                [],
                [0],
                slice(None, None, 2),
                slice(None, None, -1),
                (0, 0, 0),
                None,
                False,  # an int to safetensors (row 0), not a mask
                (0, True),
                2**31,  # past PyO3's i32: "unsupported"
                slice(2**64, None),
            ):
                s = outcome(lambda: ours.get_slice(name)[key])
                t = outcome(lambda: theirs.get_slice(name)[key])
                assert s[0] == t[0], (name, key, s, t)
                if t[0] == "ok":
                    same(s[1], t[1])
                else:
                    assert type(s[1]) is type(t[1]) or (
                        isinstance(t[1], safetensors.SafetensorError)
                        and isinstance(s[1], st.SafetensorError)
                    ), (name, key, s, t)
                    assert str(s[1]) == str(t[1]), (name, key, s, t)


def test_errors_are_those_safetensors_code_catches(pt_file: Path, tmp_path: Path) -> None:
    assert issubclass(st.SafetensorError, Exception) and st.SafetensorError is st.StagingError
    missing = tmp_path / "missing.safetensors"
    for module in (safetensors, st):
        with pytest.raises(FileNotFoundError):
            module.safe_open(missing, framework="pt")
        with module.safe_open(pt_file, framework="pt") as f:
            with pytest.raises(module.SafetensorError, match="File does not contain tensor nope"):
                f.get_tensor("nope")
            with pytest.raises(module.SafetensorError, match="File does not contain tensor nope"):
                f.get_slice("nope")
        with pytest.raises(module.SafetensorError, match="framework tf2 is invalid"):
            module.safe_open(pt_file, framework="tf2")
        with pytest.raises(module.SafetensorError, match="File is closed"):
            f.get_tensor("row")
    # A save that cannot write: safetensors' error class (here also a FileNotFoundError).
    for module, saving in ((safetensors, safetensors.torch), (st, st.torch)):
        with pytest.raises(module.SafetensorError, match="Error while serializing"):
            saving.save_file({"a": torch.ones(2)}, tmp_path / "nodir" / "x.safetensors")
    with pytest.raises(FileNotFoundError):
        st.torch.save_file({"a": torch.ones(2)}, tmp_path / "nodir" / "x.safetensors")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00hello")
    for module in (safetensors, st):
        with pytest.raises(module.SafetensorError):
            module.safe_open(bad, framework="pt")


def test_safe_open_takes_a_directory_an_index_and_options(tmp_path: Path) -> None:
    contents = write_sharded(
        tmp_path / "sharded", [[("a", "F32", (4, 2)), ("b", "I8", (3,))], [("c", "F16", (2, 2))]]
    )
    for path in (tmp_path / "sharded", tmp_path / "sharded" / "model.safetensors.index.json"):
        with st.safe_open(path, framework="pt", backend="mmap", chunk_size="1MiB") as f:
            assert f.keys() == ["a", "b", "c"] and f.backend == "host"
            for name, data in contents.items():
                assert (
                    f.get_tensor(name).contiguous().view(torch.uint8).reshape(-1).numpy().tobytes()
                    == data
                )
    with pytest.raises(st.InvalidOptionError):
        st.safe_open(
            tmp_path / "sharded", framework="pt", select=["a"]
        )  # a handle chooses by asking


@pytest.mark.parametrize("mapped", [True, False], ids=["mapped", "read"])
def test_a_handle_serves_the_file_it_opened_and_refuses_one_changed_in_place(
    tmp_path: Path, mapped: bool
) -> None:
    path = tmp_path / "model.safetensors"
    safetensors.torch.save_file({"a": torch.ones(4), "b": torch.zeros(4)}, path)
    fd_dir = Path("/proc/self/fd")

    def open_fds() -> int:
        return sum(1 for p in fd_dir.iterdir() if os.path.realpath(p) == str(path))

    options = {} if mapped else {"map": False}
    with (
        st.safe_open(path, framework="pt", **options) as ours,
        safetensors.safe_open(path, framework="pt") as theirs,
    ):
        assert open_fds() <= 2, "at most one descriptor each, kept for the handle"
        # A new file saved over it (atomically, a rename, as save_file does) after the
        # handles opened it: both keep serving the file they opened, whole.
        st.torch.save_file({"a": torch.full((4,), 7.0), "b": torch.full((4,), 7.0)}, path)
        for name, want in (("a", torch.ones(4)), ("b", torch.zeros(4))):
            assert torch.equal(ours.get_tensor(name), want), name
            assert torch.equal(theirs.get_tensor(name), want), name
    assert open_fds() == 0, "closed with the handles"
    # Written in place under a handle: `safetensors` would hand out the new bytes under the
    # old header; this refuses them.
    with st.safe_open(path, framework="pt", **options) as ours:
        time.sleep(0.02)  # the file system's timestamps are coarse
        with open(path, "r+b") as f:
            f.seek(os.path.getsize(path) - 4)
            f.write(b"\x00\x00\x80\x3f")
        with pytest.raises(st.ReadError, match="changed during the load: it was modified"):
            ours.get_tensor("b")


def test_saving_writes_what_safetensors_writes(tmp_path: Path) -> None:
    tensors = torch_tensors()
    metadata = {"format": "pt"}
    assert st.torch.save(tensors, metadata) == safetensors.torch.save(tensors, metadata)
    # With two metadata keys or more, safetensors' own output varies from run to run (the crate
    # writes them in a HashMap's order); the header then agrees as JSON, the data byte for byte.
    several = {"format": "pt", "z": "last", "a": "first"}
    ours, theirs = st.torch.save(tensors, several), safetensors.torch.save(tensors, several)
    assert len(ours) == len(theirs) and ours[:8] == theirs[:8]
    n = 8 + int.from_bytes(ours[:8], "little")
    assert json.loads(ours[8:n]) == json.loads(theirs[8:n]) and ours[n:] == theirs[n:]
    assert st.torch.save(tensors) == safetensors.torch.save(tensors)
    st.torch.save_file(tensors, tmp_path / "ours.safetensors", metadata)
    safetensors.torch.save_file(tensors, tmp_path / "theirs.safetensors", metadata)
    assert (tmp_path / "ours.safetensors").read_bytes() == (
        tmp_path / "theirs.safetensors"
    ).read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ours.safetensors",
        "theirs.safetensors",
    ], "no temporary left"
    arrays = {
        k: v.numpy()
        for k, v in tensors.items()
        if k.split(".")[-1]
        in (
            "float64",
            "float32",
            "float16",
            "int64",
            "int32",
            "int16",
            "int8",
            "uint8",
            "bool",
            "complex64",
            "uint16",
        )
    }
    arrays["be"] = np.arange(6, dtype=">i4").reshape(2, 3)
    assert st.numpy.save(arrays, metadata) == safetensors.numpy.save(arrays, metadata)
    # A non-contiguous array: safetensors' numpy `save` writes its raw memory; ours its values.
    strided = np.arange(12, dtype=np.float32).reshape(3, 4).T
    np.testing.assert_array_equal(st.numpy.load(st.numpy.save({"t": strided}))["t"], strided)


def test_loading_bytes_agrees_with_safetensors() -> None:
    tensors = {
        k: v for k, v in torch_tensors().items() if "float8_e8m0" not in k and "float4" not in k
    }
    data = safetensors.torch.save(tensors, {"k": "v"})
    ours, theirs = st.torch.load(data), safetensors.torch.load(data)
    assert ours.keys() == theirs.keys()
    for name in theirs:
        same(ours[name], theirs[name])
    # Where safetensors has no torch dtype for a file's tensor (F8_E8M0, F4), this loads it.
    every = torch_tensors()
    for name, value in st.torch.load(safetensors.torch.save(every)).items():
        same(value, every[name])
    arrays = {"a": np.arange(6, dtype=np.int16).reshape(2, 3), "s": np.full((), 2.5)}
    data = safetensors.numpy.save(arrays)
    for name, value in st.numpy.load(data).items():
        same(value, safetensors.numpy.load(data)[name])
    for garbage in (b"garbage", b"\xff" * 16):
        with pytest.raises(st.SafetensorError):
            st.torch.load(garbage)
        with pytest.raises(safetensors.SafetensorError):
            safetensors.torch.load(garbage)


@pytest.mark.parametrize(
    "tensors, metadata, error",
    [
        ({"t": torch.arange(12.0).reshape(3, 4).T}, None, ValueError),  # not contiguous
        ("not a dict", None, ValueError),
        ({"t": [1, 2]}, None, ValueError),
        ({1: torch.zeros(1)}, None, TypeError),
        ({"t": torch.zeros(1)}, {"k": 1}, TypeError),
        ({"a": (x := torch.zeros(4)), "b": x}, None, RuntimeError),  # shared memory
        ({"a": (y := torch.zeros(8))[:4], "b": y[2:]}, None, RuntimeError),  # overlapping views
        ({"t": torch.zeros(2, 2).to_sparse()}, None, ValueError),
    ],
    ids=[
        "noncontiguous",
        "not-a-dict",
        "not-a-tensor",
        "int-key",
        "int-metadata",
        "shared",
        "overlap",
        "sparse",
    ],
)
def test_saving_refuses_what_safetensors_refuses(tensors: Any, metadata: Any, error: type) -> None:
    with pytest.raises(error):
        safetensors.torch.save(tensors, metadata)
    with pytest.raises(error):
        st.torch.save(tensors, metadata)


def test_two_halves_of_one_buffer_are_not_shared() -> None:
    buffer = torch.arange(8.0)
    tensors = {"a": buffer[:4], "b": buffer[4:]}
    assert st.torch.save(tensors) == safetensors.torch.save(tensors)


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight  # tied


def test_save_model_and_load_model_agree_with_safetensors(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Tied()
    st.torch.save_model(model, tmp_path / "ours.safetensors")
    safetensors.torch.save_model(model, tmp_path / "theirs.safetensors")
    assert (tmp_path / "ours.safetensors").read_bytes() == (
        tmp_path / "theirs.safetensors"
    ).read_bytes()
    fresh, reference = Tied(), Tied()
    assert st.torch.load_model(
        fresh, tmp_path / "ours.safetensors"
    ) == safetensors.torch.load_model(reference, tmp_path / "theirs.safetensors")
    assert torch.equal(fresh.head.weight, model.head.weight)
    assert fresh.head.weight.data_ptr() == fresh.embed.weight.data_ptr(), "still tied"
    # A file missing a weight: strict raises what safetensors raises; not strict returns it.
    st.torch.save_file(
        {"embed.weight": torch.zeros(3, 4)[:0].contiguous()}, tmp_path / "wrong.safetensors"
    )
    safetensors.torch.save_file({"other": torch.zeros(1)}, tmp_path / "other.safetensors")
    for module in (safetensors.torch, st.torch):
        with pytest.raises(RuntimeError, match="Unexpected key"):
            module.load_model(Tied(), tmp_path / "other.safetensors")
    assert st.torch.load_model(
        Tied(), tmp_path / "other.safetensors", strict=False
    ) == safetensors.torch.load_model(Tied(), tmp_path / "other.safetensors", strict=False)


def test_flax_module_agrees_with_safetensors(tmp_path: Path) -> None:
    import jax.numpy as jnp
    import safetensors.flax

    import safetensors_staging.flax

    arrays = {
        "a": jnp.arange(12, dtype=jnp.float32).reshape(3, 4),
        "b": jnp.ones((2, 2), dtype=jnp.bfloat16),
        "s": jnp.asarray(3, dtype=jnp.int32),
    }
    data = safetensors.flax.save(dict(arrays))
    assert safetensors_staging.flax.save(dict(arrays)) == data
    safetensors_staging.flax.save_file(dict(arrays), tmp_path / "f.safetensors")
    assert (tmp_path / "f.safetensors").read_bytes() == data
    # safetensors' flax `load` of bytes goes through NumPy and cannot hold bfloat16; its
    # `load_file` can, and is what both are compared with.
    with pytest.raises(KeyError):
        safetensors.flax.load(data)
    want = safetensors.flax.load_file(tmp_path / "f.safetensors")
    for loaded in (
        safetensors_staging.flax.load(data),
        safetensors_staging.flax.load_file(tmp_path / "f.safetensors"),
    ):
        assert loaded.keys() == want.keys()
        for name in want:
            assert type(loaded[name]) is type(want[name])
            same(loaded[name], want[name])


def test_save_file_is_atomic_for_a_reader_of_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    st.torch.save_file({"w": torch.ones(1 << 16)}, path)
    with open(path, "rb") as reader:
        old = reader.read(64)
        st.torch.save_file({"w": torch.full((1 << 16,), 2.0)}, path)
        reader.seek(0)
        assert reader.read(64) == old, "the old file's reader still reads the old file"
    assert torch.equal(st.torch.load_file(path)["w"], torch.full((1 << 16,), 2.0))
    # A save that fails leaves the file as it was, and no temporary file behind.
    before = path.read_bytes()
    with pytest.raises(ValueError):
        st.torch.save_file({"w": torch.zeros(4, 4).T}, path)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == [
        "model.safetensors"
    ]


def test_loads_of_every_dtype_file_agree(tmp_path: Path) -> None:
    """Files written independently of both packages (the suite's own writer)."""
    path = tmp_path / "every.safetensors"
    # Torch has no dtype for F6, nor for an F4 tensor with an odd last dimension.
    specs = [
        s for s in every_dtype_specs() if s[1] not in ("F6_E2M3", "F6_E3M2") and s[0] != "odd.F4"
    ]
    write_safetensors(path, specs)
    theirs = safetensors.torch.load_file(path)
    ours = st.torch.load_file(path, backend="mmap")
    assert ours.keys() == theirs.keys()
    for name, value in theirs.items():
        same(ours[name], value)


def test_threads_share_one_handle(pt_file: Path) -> None:
    want = safetensors.torch.load_file(pt_file)
    errors: List[BaseException] = []
    with st.safe_open(pt_file, framework="pt") as f:

        def read() -> None:
            try:
                for name in f.keys():
                    same(f.get_tensor(name), want[name])
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=read) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors


def test_transformers_loads_through_safe_open(
    minilm_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`transformers.modeling_utils.safe_open` swapped for ours: from_pretrained's own path
    (get_slice per key, `[...]` to materialize) gives bit-equal embeddings."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers.modeling_utils
    from transformers import AutoModel, AutoTokenizer

    from test_model import embed

    tokenizer = AutoTokenizer.from_pretrained(minilm_dir)
    reference = AutoModel.from_pretrained(minilm_dir).eval()
    opened: List[Any] = []

    def recording_safe_open(*args: Any, **kwargs: Any) -> Any:
        handle = st.safe_open(*args, **kwargs)
        opened.append(handle)
        return handle

    monkeypatch.setattr(transformers.modeling_utils, "safe_open", recording_safe_open)
    model = AutoModel.from_pretrained(minilm_dir).eval()
    assert opened, "transformers opened the checkpoint through safetensors_staging.safe_open"
    assert sum(h.report()["tensors"] for h in opened) >= len(model.state_dict()) - 1
    assert torch.equal(embed(model, tokenizer), embed(reference, tokenizer))
    for (name, p), (_, q) in zip(model.state_dict().items(), reference.state_dict().items()):
        assert torch.equal(p, q), name


# safetensors' raw API and the `safetensors.torch` helpers other libraries import.

SPEC_ARRAYS = {
    "bool": np.array([True, False, True]),
    "int8": np.arange(-3, 3, dtype=np.int8),
    "uint8": np.arange(6, dtype=np.uint8),
    "int16": np.arange(6, dtype=np.int16).reshape(2, 3),
    "uint16": np.arange(6, dtype=np.uint16),
    "int32": np.arange(6, dtype=np.int32),
    "uint32": np.arange(6, dtype=np.uint32),
    "int64": np.arange(6, dtype=np.int64).reshape(3, 2),
    "uint64": np.arange(6, dtype=np.uint64),
    "float16": np.linspace(-1, 1, 6, dtype=np.float16),
    "float32": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4),
    "float64": np.linspace(-1, 1, 6),
    "complex64": np.array([1 + 2j, 3 - 4j], dtype=np.complex64),
    "empty": np.zeros((0, 4), dtype=np.float32),
    "scalar": np.array(7.5, dtype=np.float32),
}


def specs(module: Any) -> Dict[str, Any]:
    return {
        name: module.TensorSpec(
            dtype=a.dtype.name,
            shape=a.shape,
            data_ptr=a.ctypes.data,
            data_len=a.nbytes,
        )
        for name, a in SPEC_ARRAYS.items()
    }


def test_serialize_of_tensor_specs_is_safetensors_byte_for_byte(tmp_path: Path) -> None:
    theirs = safetensors.serialize(specs(safetensors), metadata={"format": "np"})
    ours = st.serialize(specs(st), metadata={"format": "np"})
    assert ours == theirs
    st.serialize_file(specs(st), tmp_path / "ours.safetensors", metadata={"format": "np"})
    assert (tmp_path / "ours.safetensors").read_bytes() == theirs
    # deserialize: the same entries (their order is the file's, ours too).
    assert sorted(st.deserialize(theirs)) == sorted(safetensors.deserialize(theirs))
    for name, entry in st.deserialize(theirs):
        assert bytes(entry["data"]) == SPEC_ARRAYS[name].tobytes()
        assert isinstance(entry["data"], bytearray)
    spec = st.TensorSpec(dtype="bfloat16", shape=(2, 3), data_ptr=8, data_len=12)
    assert (spec.dtype, spec.shape, spec.data_ptr, spec.data_len) == ("BF16", [2, 3], 8, 12)
    assert repr(spec) == repr(
        safetensors.TensorSpec(dtype="bfloat16", shape=(2, 3), data_ptr=8, data_len=12)
    )
    fp4 = st.TensorSpec(dtype="float4_e2m1fn_x2", shape=[4, 3], data_ptr=8, data_len=12)
    assert fp4.shape == [4, 6]  # two values a byte: the header counts values
    with pytest.raises(AttributeError):
        spec.data_len = 0  # type: ignore[misc]


def theirs_bytes() -> bytes:
    return safetensors.serialize(specs(safetensors))


def test_serialize_refuses_what_safetensors_refuses_and_writes_nothing(tmp_path: Path) -> None:
    a = np.arange(6, dtype=np.float32)
    with pytest.raises(st.SafetensorError, match='Unknown dtype "nonsense"'):
        st.TensorSpec(dtype="nonsense", shape=[1], data_ptr=0, data_len=0)
    # Raw dicts (the API before safetensors 0.8) are a TypeError, in both.
    raw = {"t": {"dtype": "float32", "shape": [1], "data_ptr": 0, "data_len": 0}}
    for module in (safetensors, st):
        with pytest.raises(TypeError):
            module.serialize(raw)  # type: ignore[arg-type]
    # A length that does not match dtype and shape: refused, no file.
    short = {"t": st.TensorSpec(dtype="float32", shape=[7], data_ptr=a.ctypes.data, data_len=24)}
    with pytest.raises(st.SafetensorError):
        st.serialize(short)
    with pytest.raises(st.SafetensorError):
        st.serialize_file(short, tmp_path / "short.safetensors")
    assert list(tmp_path.iterdir()) == []
    # A null address with bytes to read: an error, not a crash (safetensors would read it).
    null = {"t": st.TensorSpec(dtype="float32", shape=[6], data_ptr=0, data_len=24)}
    with pytest.raises(st.SafetensorError, match="null data_ptr"):
        st.serialize(null)
    for bad in (b"\x01", b"\x05\x00\x00\x00\x00\x00\x00\x00hello", theirs_bytes()[:-1]):
        with pytest.raises(safetensors.SafetensorError) as want:
            safetensors.deserialize(bytes=bad)
        with pytest.raises(st.SafetensorError) as got:
            st.deserialize(bytes=bad)
        assert str(got.value) == str(want.value)


def test_the_torch_helpers_are_safetensors(tmp_path: Path) -> None:
    base = torch.arange(12.0)
    tied = torch.nn.Linear(4, 4)
    state = {
        "whole": base,
        "view": base[:6],
        "other_half": base[6:],
        "alone": torch.zeros(3),
        "tied_a": tied.weight,
        "tied_b": tied.weight,
        "meta": torch.empty(2, device="meta"),
        "empty": torch.empty(0),
    }
    for name, tensor in state.items():
        assert st.torch.storage_ptr(tensor) == safetensors.torch.storage_ptr(tensor), name
        assert st.torch.storage_size(tensor) == safetensors.torch.storage_size(tensor), name
        assert st.torch._is_complete(tensor) == safetensors.torch._is_complete(tensor), name
        assert st.torch._end_ptr(tensor) == safetensors.torch._end_ptr(tensor), name
    assert st.torch._find_shared_tensors(state) == safetensors.torch._find_shared_tensors(state)
    complete = {k: v for k, v in state.items() if k not in ("other_half", "meta", "empty")}
    for kwargs in ({}, {"preferred_names": ["view"]}, {"discard_names": ["tied_a"]}):
        assert st.torch._remove_duplicate_names(
            complete, **kwargs
        ) == safetensors.torch._remove_duplicate_names(complete, **kwargs)
    # No name of a group covers its storage: both refuse.
    halves = {"a": base[:6], "b": base[6:]}
    for module in (safetensors.torch, st.torch):
        with pytest.raises(RuntimeError):
            module._remove_duplicate_names({"a": base[2:8], "b": base[4:10], **halves})


def test_bfloat16_arrays_follow_safetensors_once_ml_dtypes_is_imported(tmp_path: Path) -> None:
    # `safetensors.numpy` asks NumPy for a dtype named "bfloat16": a TypeError until a package
    # registers one (ml_dtypes, which JAX imports), a bfloat16 array after. Run in a fresh
    # interpreter, where nothing has imported ml_dtypes yet.
    import subprocess
    import sys
    import textwrap

    path = tmp_path / "bf16.safetensors"
    safetensors.torch.save_file(
        {"b": torch.arange(12, dtype=torch.bfloat16).reshape(3, 4), "f": torch.ones(2)}, path
    )
    code = f"""
        import json, safetensors, safetensors.numpy, safetensors_staging, safetensors_staging.numpy
        def outcome(call):
            try:
                value = call()
            except Exception as e:
                return ["raised", isinstance(e, TypeError)]
            return [str(value.dtype), list(value.shape), value.tobytes().hex()]
        def every(module, numpy_module):
            with module.safe_open({str(path)!r}, framework="np") as f:
                return [
                    outcome(lambda: f.get_tensor("b")),
                    outcome(lambda: f.get_slice("b")[1:3]),
                    outcome(lambda: numpy_module.load_file({str(path)!r})["b"]),
                ]
        before = [every(safetensors, safetensors.numpy), every(safetensors_staging, safetensors_staging.numpy)]
        import ml_dtypes
        after = [every(safetensors, safetensors.numpy), every(safetensors_staging, safetensors_staging.numpy)]
        print(json.dumps([before, after]))
    """
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    before, after = json.loads(done.stdout)
    theirs, ours = before
    assert theirs == [["raised", True]] * 3 and ours == theirs
    theirs, ours = after
    assert theirs[0][:2] == ["bfloat16", [3, 4]] and theirs[1][:2] == ["bfloat16", [2, 4]]
    assert ours == theirs


def test_empty_tensors_have_the_strides_safetensors_gives(tmp_path: Path) -> None:
    """Random shapes with a dimension of 0 somewhere (and some without), every dtype torch and
    NumPy share: each door gives the shape and strides `safetensors` gives (torch counts a
    dimension of 0 as 1 in the strides after it; `safetensors`' NumPy arrays have every stride
    0). Compact strides gave `(0, 2, 1)` where `safetensors` gives `(2, 2, 1)`."""
    rng = np.random.default_rng(9)
    dtypes = [torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.int64, torch.bool]
    tensors: Dict[str, torch.Tensor] = {}
    for i in range(120):
        shape = [int(d) for d in rng.integers(0, 4, size=int(rng.integers(0, 5)))]
        tensors[f"t{i}"] = torch.zeros(shape, dtype=dtypes[i % len(dtypes)])
    assert sum(t.numel() == 0 for t in tensors.values()) > 40
    path = tmp_path / "empty.safetensors"
    safetensors.torch.save_file(tensors, path)
    theirs = safetensors.torch.load_file(path)
    for ours in (safetensors_staging.torch.load_file(path), st.load_file(path, map=False)):
        for name, tensor in theirs.items():
            got = ours[name]
            assert (got.shape, got.stride(), got.dtype) == (
                tensor.shape,
                tensor.stride(),
                tensor.dtype,
            ), name
    with safetensors.safe_open(path, "pt") as a, st.safe_open(path, "pt") as b:
        for name in theirs:
            assert b.get_tensor(name).stride() == a.get_tensor(name).stride(), name
            if theirs[name].dim():  # a scalar takes no slice, in either
                assert b.get_slice(name)[:].stride() == a.get_slice(name)[:].stride(), name
    numpy_path = tmp_path / "empty_np.safetensors"
    safetensors.numpy.save_file(
        {n: t.numpy() for n, t in tensors.items() if t.dtype != torch.bfloat16}, numpy_path
    )
    their_arrays = safetensors.numpy.load_file(numpy_path)
    our_arrays = safetensors_staging.numpy.load_file(numpy_path)
    for name, array in their_arrays.items():
        got = our_arrays[name]
        assert (got.shape, got.strides, got.dtype) == (array.shape, array.strides, array.dtype)


def test_the_garbage_collector_of_other_threads_is_left_alone(tmp_path: Path) -> None:
    """`safetensors` never touches Python's cyclic GC. A load that pauses it does so only where
    it is the process's one Python thread: with another thread alive, that thread sees the
    collector on throughout, and a `gc.disable()` it makes meanwhile is not undone at the end
    (issue 57.8: the pause was process-wide, and its end re-enabled the collector)."""
    import gc

    path = tmp_path / "many.safetensors"
    safetensors.torch.save_file({f"t{i}": torch.zeros(2) for i in range(5_000)}, path)
    loads = {
        "safetensors": lambda: safetensors.torch.load_file(path),
        "ours": lambda: safetensors_staging.torch.load_file(path),
        "ours (stage)": lambda: st.load_file(path),
    }
    import _thread

    for who, load in loads.items():
        # A watcher started by `threading`, and one by `_thread` (as C code or an extension
        # would start it: `threading` does not count it).
        for started_by in ("threading", "_thread"):
            seen_off, stop, stopped = [], threading.Event(), threading.Event()

            def watch() -> None:
                while not stop.is_set():
                    if not gc.isenabled():
                        seen_off.append(True)
                stopped.set()

            if started_by == "threading":
                threading.Thread(target=watch).start()
            else:
                _thread.start_new_thread(watch, ())
            try:
                for _ in range(3):
                    load()
            finally:
                stop.set()
                stopped.wait(10)
            assert not seen_off, f"{who}: a {started_by} thread ran without the collector"
        # A thread's own gc.disable() made during the loads stays.
        started, disabled = threading.Event(), threading.Event()

        def disable_midway() -> None:
            started.wait()
            time.sleep(0.01)
            gc.disable()
            disabled.set()

        other = threading.Thread(target=disable_midway)
        other.start()
        try:
            started.set()
            while not disabled.is_set():
                load()
            load()
            assert not gc.isenabled(), f"{who}: the load undid another thread's gc.disable()"
        finally:
            other.join()
            gc.enable()
