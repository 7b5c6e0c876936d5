"""One source of truth: every door of the package gives the same answer the library gives, for
the same selection and rows, the same URLs, the same device spellings and the same dtypes, and
every exception carries its `kind`, whoever raised it. The Python layer asks the native module
(`_native._select`, `_is_url`, `_url_store`, `_device`, `_DTYPES`) instead of deciding again."""

from __future__ import annotations

import datetime
import json
import re
import socket
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import safetensors_staging as st
from safetensors_staging import _load, _native

from conftest import BITS, write_safetensors, write_sharded
from test_engines_vllm import use_standin
from test_remote import aws, moto, upload_dir  # noqa: F401 - fixtures

TIMEOUT = datetime.timedelta(seconds=60)

SELECT = ["model.layers.0.*", "lm_head.weight"]
ROWS = {"*proj.weight": "1/2", "lm_head.weight": (8, 24)}


@pytest.fixture(scope="module")
def layered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two shards named as a transformer's are: layers selected by glob, rows by glob."""
    directory = tmp_path_factory.mktemp("layered")
    layer = lambda i: [  # noqa: E731
        (f"model.layers.{i}.self_attn.q_proj.weight", "BF16", (32, 16)),
        (f"model.layers.{i}.mlp.up_proj.weight", "F16", (47, 16)),
        (f"model.layers.{i}.input_layernorm.weight", "F32", (16,)),
    ]
    write_sharded(
        directory,
        [
            [("model.embed_tokens.weight", "F32", (64, 16)), *layer(0)],
            [*layer(1), ("lm_head.weight", "F32", (64, 16))],
        ],
        seed=21,
    )
    return directory


def _raw(t: torch.Tensor) -> bytes:
    return bytes(t.contiguous().reshape(-1).view(torch.uint8).numpy())


def _described(tensors: Dict[str, torch.Tensor]) -> Dict[str, Any]:
    """What two loads must agree on: names in order, dtype, shape and bytes of each."""
    return {name: [str(t.dtype), list(t.shape), _raw(t).hex()] for name, t in tensors.items()}


# -- selection and rows -------------------------------------------------------------------------


def _group_worker(rank: int, world: int, path: str, store_options: Any, out: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=world, timeout=TIMEOUT
    )
    result: Dict[str, Any] = {}
    # Each door given the same keywords; the process group's load must equal the plain one.
    cases = {
        "globs and row rules": {"select": SELECT, "rows": ROWS},
        "one glob": {"select": "model.layers.1.*"},
        "a function and a row rule": {
            "select": lambda n: n.endswith("proj.weight"),
            "rows": {"*": "0/3"},
        },
    }
    remote = {} if store_options is None else {"store_options": store_options, "retries": 0}
    for case, keywords in cases.items():
        try:
            plain = _described(st.load_file(path, **keywords, **remote))
            group = _described(
                st.load_file(
                    path, process_group=dist.group.WORLD, relay_chunk=1 << 12, **keywords, **remote
                )
            )
            result[case] = {"plain": plain, "group": group}
        except Exception as e:  # noqa: BLE001 - reported to the test
            result[case] = {"error": f"{type(e).__name__}: {e}"}
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def _run_group(path: str, tmp_path: Path, store_options: Any = None) -> List[Dict[str, Any]]:
    out = tmp_path / "ranks"
    out.mkdir()
    mp.spawn(_group_worker, args=(2, path, store_options, str(out)), nprocs=2, join=True)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def _check_group_equals_plain(results: List[Dict[str, Any]]) -> None:
    for rank, result in enumerate(results):
        for case, got in result.items():
            assert "error" not in got, (rank, case, got.get("error"))
            assert list(got["group"]) == list(got["plain"]), (
                rank,
                case,
                list(got["group"]),
                list(got["plain"]),
            )
            assert got["group"] == got["plain"], (rank, case)
            assert got["plain"], (rank, case, "selected nothing")


def test_a_group_load_keeps_what_a_plain_load_keeps(layered: Path, tmp_path: Path) -> None:
    results = _run_group(str(layered), tmp_path)
    _check_group_equals_plain(results)
    kept = results[0]["globs and row rules"]["plain"]
    assert list(kept) == [
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.mlp.up_proj.weight",
        "model.layers.0.input_layernorm.weight",
        "lm_head.weight",
    ]
    assert kept["model.layers.0.mlp.up_proj.weight"][1] == [23, 16]  # part 1 of 2 of 47 rows
    assert kept["lm_head.weight"][1] == [16, 16]


def test_the_library_says_what_a_selection_keeps(layered: Path) -> None:
    """`_native._select` is what a load keeps: the names, their rows and narrowed offsets."""
    checkpoint, kept = _native._select([str(layered)], select=SELECT, rows=ROWS)
    with st.stage(layered, select=SELECT, rows=ROWS) as load:
        loaded = dict(load)
        listed = load.report()["tensor_list"]
    assert [t.name for t in kept] == list(loaded) == [r["name"] for r in listed]
    for info in kept:
        assert list(loaded[info.name].shape) == list(info.shape), info
        whole = checkpoint[info.name]
        first_row = info.rows[0] if info.rows else 0
        assert info.offset - whole.offset == first_row * (whole.nbytes // whole.shape[0]), info
    with pytest.raises(st.SelectionError) as raised:
        _native._select([str(layered)], select=["model.layers.9.mlp.up_proj.weight"])
    assert raised.value.kind == "selection"


def test_a_typed_selection_that_keeps_nothing_is_refused_by_every_door(
    layered: Path, stage_bin: Path
) -> None:
    """Names and globs that keep no tensor are the library's `SelectionError` (issue 58: only
    `stage` refused them, Python loaded nothing), with `stage`'s message; an explicit empty
    `select=[]` or a function that accepts no name still loads nothing."""
    import subprocess

    patterns = ["model.layers.9.*", "*.bias"]
    expected = "the selection model.layers.9.*, *.bias matches no tensor of the checkpoint"
    doors = {
        "load_file": lambda: st.load_file(layered, select=patterns),
        "stage": lambda: dict(st.stage(layered, select=patterns)),
        "native": lambda: _native._select([str(layered)], select=patterns),
    }
    for door, call in doors.items():
        with pytest.raises(st.SelectionError) as raised:
            call()
        assert (raised.value.kind, str(raised.value)) == ("selection", expected), door
    command = [str(stage_bin), str(layered), "--backend", "host"]
    for pattern in patterns:
        command += ["--select", pattern]
    out = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert (out.returncode, out.stderr) == (1, f"stage: error: {expected}\n")
    assert st.load_file(layered, select=[]) == {}
    assert st.load_file(layered, select=lambda name: False) == {}


def test_safe_open_reads_the_rows_a_plain_load_keeps(layered: Path) -> None:
    _, kept = _native._select([str(layered)], select=SELECT, rows=ROWS)
    plain = st.load_file(layered, select=SELECT, rows=ROWS)
    with st.safe_open(layered, framework="pt") as f:
        for info in kept:
            whole = f.get_slice(info.name)
            got = whole[info.rows[0] : info.rows[1]] if info.rows else whole[:]
            assert _raw(got) == _raw(plain[info.name]), info.name


# -- URLs ---------------------------------------------------------------------------------------

# URLs of every scheme the remote backend reads (as `Scheme::of` spells them), and the store.
READ_URLS = {
    "s3://bucket/model": "s3",
    "hf://org/model": "hub",
    "HF://org/model@v1/sub": "hub",
    "s3a://bucket/model": "s3",
    "S3A://bucket/model": "s3",
    "gs://bucket/model": "gcs",
    "az://container/model": "azure",
    "abfs://container/model": "azure",
    "abfss://container@account/model": "azure",
    "azure://container/model": "azure",
    "http://host:8080/model": "http",
    "https://host/model": "http",
}
# A URL, but of a scheme nothing reads: the library's error, not a local directory.
UNREAD_URLS = ["ftp://host/model"]
NOT_URLS = [
    "model_dir",
    "/abs/model",
    "./s3:/bucket",
    "C:\\models",
    "3s://bucket/model",
    "s3:/bucket/model",
]


def test_the_library_tells_urls_from_paths() -> None:
    for url, store in READ_URLS.items():
        assert _native._is_url(url) and _native._url_store(url) == store, url
    for url in UNREAD_URLS:
        assert _native._is_url(url) and _native._url_store(url) is None, url
    for path in NOT_URLS:
        assert not _native._is_url(path) and _native._url_store(path) is None, path


class _Recorded:
    """`st.stage` recording what it was handed, loading nothing."""

    def __init__(self, sources: List[Any]) -> None:
        self.sources = sources

    def __call__(self, source: Any, device: Any = "cpu", **options: Any) -> _Recorded:
        self.sources.append(source)
        return self

    def __enter__(self) -> _Recorded:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def __iter__(self) -> Iterator[Any]:
        return iter(())

    def report(self) -> Dict[str, Any]:
        return {}


@pytest.fixture
def engines(monkeypatch: pytest.MonkeyPatch) -> Iterator[Tuple[Any, Any]]:
    """The vLLM and SGLang stand-ins, with `st.stage` recording its sources."""
    vllm = use_standin(monkeypatch, "vllm")
    next(vllm)
    sglang = use_standin(monkeypatch, "sglang")
    next(sglang)
    import safetensors_staging.sglang as sglang_plugin
    import safetensors_staging.vllm as vllm_plugin

    yield vllm_plugin, sglang_plugin
    for standin in (vllm, sglang):
        next(standin, None)


def test_the_engines_hand_every_url_to_the_library(
    engines: Tuple[Any, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    vllm_plugin, sglang_plugin = engines
    from sglang.srt.configs.load_config import LoadConfig as SglangLoadConfig
    from sglang.srt.model_loader.loader import DefaultModelLoader
    from vllm.config.load import LoadConfig as VllmLoadConfig
    from vllm.model_executor.model_loader.default_loader import (
        DefaultModelLoader as VllmDefaultModelLoader,
    )

    config_dir = tmp_path / "config-only"
    config_dir.mkdir()
    local = tmp_path / "weights"
    local.mkdir()
    write_safetensors(local / "model.safetensors", [("w", "F32", (4,))])
    sources: List[Any] = []
    monkeypatch.setattr(_load, "stage", _Recorded(sources))

    class ModelConfig:
        model = model_path = str(config_dir)
        revision = quantization = None

    for weights in [*READ_URLS, *UNREAD_URLS, str(local)]:
        expected = weights if weights in READ_URLS else [str(local / "model.safetensors")]
        if weights in UNREAD_URLS:
            # Refused when the loader is made: the library reads no such scheme.
            with pytest.raises(ValueError, match="a URL of a scheme this library does not read"):
                vllm_plugin.StagingModelLoader(
                    VllmLoadConfig(
                        load_format="staging", model_loader_extra_config={"weights": weights}
                    )
                )
            continue
        vllm = vllm_plugin.StagingModelLoader(
            VllmLoadConfig(load_format="staging", model_loader_extra_config={"weights": weights})
        )
        vllm.download_model(ModelConfig())  # a URL is nothing to download
        del sources[:]
        list(vllm._get_weights_iterator(VllmDefaultModelLoader.Source(str(config_dir), None)))
        assert sources == [expected], ("vllm", weights, sources)

        sglang = sglang_plugin.StagingModelLoader(
            SglangLoadConfig(
                load_format=sglang_plugin.StagingModelLoader,
                model_loader_extra_config={"weights": weights},
            )
        )
        sglang.download_model(ModelConfig())
        del sources[:]
        list(sglang._get_weights_iterator(DefaultModelLoader.Source(str(config_dir), None)))
        assert sources == [expected], ("sglang", weights, sources)


def test_a_group_load_of_a_url_takes_the_remote_keywords(
    aws: str,  # noqa: F811
    layered: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`s3a://` in a bucket whose endpoint only `store_options` names (the environment's is a
    closed port): the plain load and the process group's read the same tensors."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    upload_dir(aws, "truth", "layered", layered)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{closed}")
    results = _run_group("s3a://truth/layered", tmp_path, store_options={"aws_endpoint": aws})
    _check_group_equals_plain(results)
    local = _described(st.load_file(layered, select=SELECT, rows=ROWS))
    assert results[1]["globs and row rules"]["group"] == local


# -- devices ------------------------------------------------------------------------------------

GOOD_DEVICES = [
    "cpu",
    "auto",
    "cuda",
    "cuda:0",
    "cuda:3",
    "3",
    3,
    " cuda:1 ",
    "hip",
    "hip:2",
    torch.device("cuda", 2),
    torch.device("cpu"),
]
BAD_DEVICES = ["cuda:", "cpu:0", "gpu", "cuda:x", "mps", "cuda:-1", "hip:one"]


def _library_device(spelled: Any) -> Tuple[str, Any]:
    """The device the library's options hold for `device=spelled`, from their printout."""
    printed = _native._options(device=spelled)
    found = re.search(r"^device = (auto|cpu|cuda:(\d+)|hip:(\d+))(?:  # default)?$", printed, re.M)
    assert found, printed
    index = found.group(2) or found.group(3)
    return found.group(1), None if index is None else int(index)


def test_every_door_reads_a_device_as_the_library_does(layered: Path, tmp_path: Path) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0, world_size=1
    )
    try:
        for spelled in BAD_DEVICES:
            with pytest.raises(st.InvalidOptionError) as library:
                _native._options(device=spelled)
            doors = {
                "load_file": lambda: st.load_file(layered, device=spelled),
                "process_group": lambda: st.load_file(
                    layered, device=spelled, process_group=dist.group.WORLD
                ),
                "safe_open": lambda: st.safe_open(layered, framework="pt", device=spelled),
                "native": lambda: _native._device(spelled),
            }
            for door, call in doors.items():
                try:
                    call()
                except Exception as e:  # noqa: BLE001 - compared below
                    got = (type(e).__name__, str(e))
                else:
                    got = ("no error", "")
                assert got == ("InvalidOptionError", str(library.value)), (door, spelled, got)
    finally:
        dist.destroy_process_group()
    for spelled in GOOD_DEVICES:
        assert tuple(_native._device(spelled)) == _library_device(spelled), spelled


# -- dtypes -------------------------------------------------------------------------------------


def test_one_dtype_table_from_the_library() -> None:
    table = _native._DTYPES
    assert {name: d.bits for name, d in table.items()} == BITS
    for name, d in table.items():
        assert d.name == name
        if d.torch is not None:
            torch_dtype = getattr(torch, d.torch)
            # Whole elements of torch's dtype hold whole elements of this one (F4: two).
            assert (torch_dtype.itemsize * 8) % d.bits == 0, name
        if d.numpy is not None:
            import numpy

            assert numpy.dtype(d.numpy).itemsize * 8 == d.bits, name


# -- errors -------------------------------------------------------------------------------------

CLASS_KINDS = {
    "StagingError": "internal",
    "MalformedCheckpointError": "invalid-checkpoint",
    "ReadError": "read",
    "PathNotFoundError": "not-found",
    "PathPermissionError": "permission-denied",
    "BackendUnavailableError": "backend-unavailable",
    "DeviceError": "device",
    "InvalidOptionError": "invalid-option",
    "OutOfMemoryError": "device-allocation",
    "SelectionError": "selection",
    "DestinationError": "destination",
    "UnsupportedDtypeError": "unsupported-dtype",
    "ResourceError": "resource",
    "MismatchError": "selection",
    "PartialLoadError": "read",
    "LoadIntoError": "read",
}


def test_every_exception_class_has_its_kind() -> None:
    classes = {
        name: getattr(st, name)
        for name in st.__all__
        if isinstance(getattr(st, name), type) and issubclass(getattr(st, name), st.StagingError)
    }
    assert set(classes) - {"SafetensorError"} == set(CLASS_KINDS)
    for name, kind in CLASS_KINDS.items():
        cls = classes[name]
        assert "kind" in vars(cls) and cls.kind == kind, (name, vars(cls).get("kind"))
        raised = cls("from Python")
        assert raised.kind == kind, name


def test_errors_raised_from_python_carry_their_kind(layered: Path, tmp_path: Path) -> None:
    f6 = tmp_path / "f6.safetensors"
    write_safetensors(f6, [("f6", "F6_E2M3", (4, 8))])
    import safetensors_staging.numpy as stnp
    import safetensors_staging.torch as sttorch

    with st.safe_open(layered, framework="pt") as f:
        cases = {
            "selection": lambda: f.get_tensor("absent"),
            "invalid-option": lambda: st.safe_open(layered, framework="tensorflow"),
            "unsupported-dtype": lambda: st.load_file(f6),
        }
        bf16 = sttorch.save({"b": torch.zeros(2, dtype=torch.bfloat16)})
        cases["unsupported-dtype (numpy)"] = lambda: stnp.load(bf16)
        for kind, call in cases.items():
            with pytest.raises(st.StagingError) as raised:
                call()
            assert raised.value.kind == kind.split(" ")[0], (kind, raised.value)
