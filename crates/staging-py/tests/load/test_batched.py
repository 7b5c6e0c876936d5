"""Tensors handed out in batches and made into torch's from Rust (issue 50): `_Load.take` and
`_native._Fast`. What `load_file`, `stage` and `safe_open` give must be exactly what they gave
before (and what `safetensors` gives): dtype, shape, strides, bytes, one storage per tensor."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict

import numpy as np
import pytest
import safetensors.torch
import torch

import safetensors_staging as st
import safetensors_staging.torch as st_torch
from safetensors_staging import _native
from safetensors_staging._convert import to_torch, torch_fast

# Every dtype torch has, with values that are not all zero.
TORCH_DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.uint16,
    torch.float16,
    torch.bfloat16,
    torch.int32,
    torch.uint32,
    torch.float32,
    torch.complex64,
    torch.float64,
    torch.int64,
    torch.uint64,
    torch.float8_e5m2,
    torch.float8_e4m3fn,
]


def tensors_of_every_dtype() -> Dict[str, torch.Tensor]:
    out = {}
    generator = torch.Generator().manual_seed(5)
    for i, dtype in enumerate(TORCH_DTYPES):
        raw = torch.randint(0, 256, (3 * 4 * 8 * 2,), dtype=torch.uint8, generator=generator)
        if dtype == torch.bool:
            raw = raw % 2
        size = torch.empty(0, dtype=dtype).element_size()
        out[f"t{i}.{str(dtype)[6:]}"] = raw[: 3 * 4 * size].view(dtype).reshape(3, 4)
    out["scalar"] = torch.tensor(2.5, dtype=torch.float32)
    out["empty"] = torch.empty(0, 5, dtype=torch.bfloat16)
    return out


def same(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    assert ours.dtype == theirs.dtype
    assert ours.shape == theirs.shape
    assert ours.stride() == theirs.stride()
    assert ours.device == theirs.device
    assert bytes_of(ours) == bytes_of(theirs)


def bytes_of(tensor: torch.Tensor) -> bytes:
    return tensor.reshape(-1).view(torch.uint8).numpy().tobytes()


def test_every_dtype_loads_as_safetensors_loads_it_and_each_tensor_owns_its_storage(
    tmp_path: Path,
) -> None:
    expected = tensors_of_every_dtype()
    path = tmp_path / "model.safetensors"
    safetensors.torch.save_file(expected, path)
    theirs = safetensors.torch.load_file(path)
    for kwargs in ({}, {"map": False}):
        ours = st_torch.load_file(path, **kwargs)
        assert list(ours) == list(theirs)
        for name in theirs:
            same(ours[name], theirs[name])
        # Each tensor its own storage, exactly its bytes, as `safetensors`' (transformers tells
        # tied weights by storage).
        pointers = [st_torch.storage_ptr(t) for t in ours.values() if t.nbytes]
        assert len(set(pointers)) == len(pointers)
        for name, tensor in ours.items():
            assert st_torch.storage_size(tensor) == theirs[name].untyped_storage().nbytes()
        with st.safe_open(path, "pt", **kwargs) as f:
            for name in theirs:
                same(f.get_tensor(name), theirs[name])
        with st.stage(path, **kwargs) as it:
            for name, tensor in it:
                same(tensor, theirs[name])


def test_the_converter_gives_what_the_python_conversion_gives_for_every_dtype_it_keeps() -> None:
    fast = torch_fast()
    assert "F32" in fast.dtypes and "BF16" in fast.dtypes
    # F4 and F6 have no torch dtype of that width: left to Python (which raises or gives bytes).
    assert "F4" not in fast.dtypes and "F6_E2M3" not in fast.dtypes
    # The capsule importer (torch before 2.10 has no C exchange API) gives the same tensors:
    # an example object without `__dlpack_c_exchange_api__` selects it.
    by_capsule = _native._Fast(object(), torch._C._from_dlpack, fast.dtypes)
    assert not by_capsule.exchange
    for dtype in _native._DTYPES:
        staged = _native._probe_staged(dtype)
        got = fast.convert(staged)
        if dtype not in fast.dtypes:
            assert got is None
            continue
        expected = to_torch(staged, "raise")
        same(got, expected)
        same(by_capsule.convert(staged), expected)
        # A tensor exported as bytes is not this converter's.
        assert fast.convert(staged.as_bytes()) is None


def test_a_read_failing_after_some_tensors_of_a_batch_hands_those_out_then_raises(
    tmp_path: Path,
) -> None:
    first = {f"a{i}": torch.full((1024,), float(i)) for i in range(7)}
    second = {f"b{i}": torch.full((1024,), float(i)) for i in range(5)}
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    safetensors.torch.save_file(first, a)
    safetensors.torch.save_file(second, b)
    for kwargs in ({}, {"map": False}):
        load = _native._stage([str(a), str(b)], device="cpu", **kwargs)
        # The second file cut short after the headers were read: its first tensor fails.
        whole = b.read_bytes()
        os.truncate(b, st.open(b)["b0"].offset + 100)
        got = load.take(100, 1 << 30, torch_fast())
        assert [name for name, _ in got] == list(first), kwargs
        for name, tensor in got:
            same(tensor, first[name])
        with pytest.raises(st.StagingError) as raised:
            load.take(100, 1 << 30, torch_fast())
        assert str(b) in str(raised.value), kwargs
        assert load.take(100, 1 << 30) == []  # ended
        # The tensors handed out hold their memory until dropped; nothing else is held.
        assert load.held()["caller"] == (0 if kwargs == {} else 7 * 4096)
        del got, tensor
        assert load.held() == {"device": 0, "host": 0, "caller": 0}
        # `load_file` raises it, handing out nothing.
        with pytest.raises(st.StagingError):
            st_torch.load_file([a, b], **kwargs)
        b.write_bytes(whole)


def test_a_conversion_that_raises_ends_the_load_and_frees_what_it_held(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    safetensors.torch.save_file({"a": torch.ones(4), "b": torch.ones(4)}, path)
    load = _native._stage([str(path)], device="cpu", map=False)
    calls = []

    def refuse(staged: object) -> object:
        calls.append(staged)
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        load.take(10, 1 << 30, None, refuse)
    assert len(calls) == 1
    calls.clear()
    assert load.take(10, 1 << 30) == []
    assert load.held() == {"device": 0, "host": 0, "caller": 0}


def test_take_stops_at_its_count_and_at_its_bytes(tmp_path: Path) -> None:
    tensors = {f"w{i}": torch.full((256,), float(i)) for i in range(10)}  # 1 KiB each
    path = tmp_path / "model.safetensors"
    safetensors.torch.save_file(tensors, path)
    load = _native._stage([str(path)], device="cpu")
    assert [n for n, _ in load.take(3, 1 << 30)] == ["w0", "w1", "w2"]
    # Past 1,500 bytes after the second tensor; at least one whatever the bytes.
    assert [n for n, _ in load.take(100, 1500)] == ["w3", "w4"]
    assert [n for n, _ in load.take(100, 0)] == ["w5"]
    rest = load.take(100, 1 << 30)
    assert [n for n, _ in rest] == ["w6", "w7", "w8", "w9"]
    # Not converted: `_Staged`, as `next()` gives them.
    assert all(isinstance(t, _native._Staged) for _, t in rest)
    assert np.frombuffer(bytes(np.from_dlpack(rest[0][1])), np.float32)[0] == 6.0
    assert load.take(100, 1 << 30) == []
    report = st.Stage(load, lambda s: s).report()
    assert report["tensors"] == 10 and len(report["tensor_list"]) == 10


def sharded_with_broken_shards(folder: Path) -> Dict[str, torch.Tensor]:
    """Five shards of three tensors (`s{i}.t{j}`) with an index; every shard but the second
    unreadable (its header length huge), so a load that reads their headers fails."""
    import json

    tensors: Dict[str, torch.Tensor] = {}
    weight_map = {}
    for i in range(5):
        file = f"model-{i + 1:05d}-of-00005.safetensors"
        part = {f"s{i}.t{j}": torch.full((4 + j,), float(10 * i + j)) for j in range(3)}
        safetensors.torch.save_file(part, folder / file)
        tensors.update(part)
        weight_map.update({name: file for name in part})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    for i in (1, 3, 4, 5):
        path = folder / f"model-{i:05d}-of-00005.safetensors"
        data = bytearray(path.read_bytes())
        data[:8] = (2**64 - 1).to_bytes(8, "little")
        path.write_bytes(bytes(data))
    return tensors


def test_a_select_function_reads_only_the_headers_of_the_shards_it_chooses(
    tmp_path: Path,
) -> None:
    tensors = sharded_with_broken_shards(tmp_path)
    asked = []

    def keep(name: str) -> bool:
        asked.append(name)
        return name.startswith("s1.")

    with st.stage(tmp_path, select=keep) as it:
        got = dict(it)
        report = it.report()
    assert sorted(got) == ["s1.t0", "s1.t1", "s1.t2"]
    for name, tensor in got.items():
        same(tensor, tensors[name])
    assert (report["headers_read"], report["files"]) == (1, 1)
    # Asked once for each name the index lists, before any header was read.
    assert sorted(asked) == sorted(tensors)
    # The same through load_file and a list of globs.
    assert sorted(st_torch.load_file(tmp_path, select=["s1.*"])) == sorted(got)
    # Everything: every header read, and the broken ones fail.
    with pytest.raises(st.StagingError, match="model-00001-of-00005"):
        st_torch.load_file(tmp_path)

    # A function that raises: its error, nothing loaded.
    def refuse(name: str) -> bool:
        raise KeyError(name)

    with pytest.raises(KeyError):
        st_torch.load_file(tmp_path, select=refuse)
