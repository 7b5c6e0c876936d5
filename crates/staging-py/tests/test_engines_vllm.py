"""The vLLM plugin (`safetensors_staging.vllm`) against stand-ins of the few vLLM symbols it
uses (`tests/standins/vllm`; vLLM itself pulls several GB of CUDA wheels and starts no engine
without a GPU). `test_standins_have_the_real_signatures` compares the stand-ins with the real
package where it is importable (`scripts/check-vllm.sh` installs it and runs that test)."""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterable, List, Set, Tuple

import pytest
import torch

STANDINS = Path(__file__).parent / "standins"


def real_importable(package: str) -> bool:
    """Whether the real `package` is installed (looked for without the stand-ins on the path)."""
    probe = (
        f"import importlib.util, sys; sys.exit(0 if importlib.util.find_spec({package!r}) else 1)"
    )
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


def use_standin(monkeypatch: pytest.MonkeyPatch, package: str) -> Iterable[Any]:
    """The stand-in `package` on the path and a fresh `safetensors_staging.<package>`, for the
    length of a test."""

    def forget() -> None:
        for name in list(sys.modules):
            if (
                name == package
                or name.startswith(package + ".")
                or name == f"safetensors_staging.{package}"
            ):
                del sys.modules[name]

    forget()
    monkeypatch.syspath_prepend(str(STANDINS))
    module = importlib.import_module(package)
    assert Path(module.__file__).is_relative_to(STANDINS), f"the stand-in, not a real {package}"
    yield module
    forget()


def signatures(
    used: List[Tuple[str, str, List[str]]], load_config: Any, fields: Set[str]
) -> Dict[str, Any]:
    """The parameter names of each symbol `used`, and which of `fields` `load_config` has."""
    out: Dict[str, Any] = {}
    for module, name, _ in used:
        obj: Any = importlib.import_module(module)
        for part in name.split("."):
            obj = getattr(obj, part)
        out[f"{module}:{name}"] = list(inspect.signature(obj).parameters)
    known = getattr(load_config, "__dataclass_fields__", None) or getattr(
        load_config, "model_fields", {}
    )
    out["LoadConfig"] = sorted(set(known) & fields)
    return out


def compare_with_real(test_module: str, used: List[Tuple[str, str, List[str]]]) -> None:
    """`test_module._signatures()` with the real engine and with the stand-ins: the parameters the
    loader passes are there in both, in the same order, and the config fields agree."""
    code = (
        f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
        f"from {test_module} import _signatures; print(json.dumps(_signatures()))"
    )
    real = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert real.returncode == 0, real.stderr[-2000:]
    env = dict(os.environ, PYTHONPATH=str(STANDINS))
    ours = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env
    )
    assert ours.returncode == 0, ours.stderr[-2000:]
    real_sigs = json.loads(real.stdout.strip().splitlines()[-1])
    stand_in = json.loads(ours.stdout.strip().splitlines()[-1])
    for module, name, params in used:
        key = f"{module}:{name}"
        assert takes(real_sigs[key], params) and takes(stand_in[key], params), (
            key,
            real_sigs[key],
            stand_in[key],
        )
    assert real_sigs["LoadConfig"] == stand_in["LoadConfig"]


def takes(parameters: List[str], passed: List[str]) -> bool:
    """Whether a function of `parameters` takes what the loader passes: the names in `passed`
    first and in that order (given by position), those marked `*name` anywhere (by keyword)."""
    positional = [p for p in passed if not p.startswith("*")]
    keyword = [p[1:] for p in passed if p.startswith("*")]
    return parameters[: len(positional)] == positional and all(k in parameters for k in keyword)


def imports_nothing_early(module: str, engine: str) -> None:
    """Importing `module` imports neither `engine` nor torch."""
    code = (
        f"import sys; import {module}; "
        f"assert {engine!r} not in sys.modules and 'torch' not in sys.modules, sorted(sys.modules); print('ok')"
    )
    env = dict(os.environ, PYTHONPATH=str(STANDINS))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


@pytest.fixture
def vllm(monkeypatch: pytest.MonkeyPatch) -> Iterable[Any]:
    yield from use_standin(monkeypatch, "vllm")


def checkpoint(directory: Path) -> Dict[str, torch.Tensor]:
    """A sharded checkpoint with an index, plus what vLLM's default loader leaves alone: a
    consolidated copy beside the shards (different bytes) and files under `original/`."""
    import safetensors.torch

    g = torch.Generator().manual_seed(5)
    tensors = {
        "embed.weight": torch.randn(64, 16, generator=g),
        "layer.weight": torch.randn(16, 16, generator=g),
        "layer.bias": torch.randn(16, generator=g).to(torch.bfloat16),
    }
    directory.mkdir(parents=True)
    safetensors.torch.save_file(
        {"embed.weight": tensors["embed.weight"]}, directory / "model-00001-of-00002.safetensors"
    )
    safetensors.torch.save_file(
        {k: tensors[k] for k in ("layer.weight", "layer.bias")},
        directory / "model-00002-of-00002.safetensors",
    )
    (directory / "model.safetensors.index.json").write_text(
        json.dumps(
            {
                "weight_map": {
                    "embed.weight": "model-00001-of-00002.safetensors",
                    "layer.weight": "model-00002-of-00002.safetensors",
                    "layer.bias": "model-00002-of-00002.safetensors",
                }
            }
        )
    )
    safetensors.torch.save_file(
        {k: torch.zeros_like(v) for k, v in tensors.items()}, directory / "consolidated.safetensors"
    )
    (directory / "original").mkdir()
    safetensors.torch.save_file(
        {"stray": torch.ones(1)}, directory / "original" / "model.safetensors"
    )
    return tensors


class Model(torch.nn.Module):
    """What vLLM's models offer the loader: `load_weights(iterable of (name, tensor))`, which
    copies each into its parameter, keeps every tensor it was given (as some models do), and
    returns the names loaded."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(64, 16)
        self.layer = torch.nn.Linear(16, 16, dtype=torch.float32)
        self.layer.bias = torch.nn.Parameter(torch.zeros(16, dtype=torch.bfloat16))
        self.kept: List[Tuple[str, torch.Tensor]] = []

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> Set[str]:
        params = dict(self.named_parameters())
        loaded = set()
        for name, tensor in weights:
            self.kept.append((name, tensor))
            with torch.no_grad():
                params[name].copy_(tensor)
            loaded.add(name)
        return loaded


class ModelConfig:
    def __init__(self, model: str, quantization: Any = None) -> None:
        self.model, self.revision, self.quantization = model, None, quantization


def test_importing_the_plugin_imports_neither_vllm_nor_torch() -> None:
    imports_nothing_early("safetensors_staging.vllm", "vllm")


def test_entry_point_registers_the_loader_once(vllm: Any) -> None:
    (entry,) = [
        e
        for e in importlib.metadata.entry_points(group="vllm.general_plugins")
        if e.value.startswith("safetensors_staging.")
    ]
    assert entry.value == "safetensors_staging.vllm:register"
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader import REGISTRATIONS, get_model_loader

    entry.load()()
    entry.load()()  # vLLM calls plugins in every process; twice in one is harmless
    import safetensors_staging.vllm as plugin

    assert REGISTRATIONS == [("staging", plugin.StagingModelLoader)]
    loader = get_model_loader(
        LoadConfig(load_format="staging", model_loader_extra_config={"backend": "host"})
    )
    assert type(loader) is plugin.StagingModelLoader and loader.options == {"backend": "host"}


def test_load_weights_reads_the_indexed_shards_into_owned_tensors(
    vllm: Any, tmp_path: Path
) -> None:
    from vllm.config.load import LoadConfig

    import safetensors_staging.vllm as plugin

    tensors = checkpoint(tmp_path / "model")
    loader = plugin.StagingModelLoader(
        LoadConfig(
            load_format="staging",
            model_loader_extra_config=json.dumps(
                {"backend": "host", "device_memory": "1GiB", "chunk_size": "4KiB", "threads": 2}
            ),
        )
    )
    model = Model()
    loader.download_model(ModelConfig(str(tmp_path / "model")))
    loader.load_weights(model, ModelConfig(str(tmp_path / "model")))
    # Every parameter equal to the shards' bytes (not the consolidated copy's zeros).
    assert torch.equal(model.embed.weight, tensors["embed.weight"])
    assert torch.equal(model.layer.weight, tensors["layer.weight"])
    assert torch.equal(model.layer.bias, tensors["layer.bias"])
    # The tensors handed out stay right after the load moved on: each owns its memory.
    assert sorted(n for n, _ in model.kept) == sorted(tensors)
    for name, tensor in model.kept:
        assert tensor.device.type == "cpu" and torch.equal(tensor, tensors[name]), name
    pointers = [t.data_ptr() for _, t in model.kept]
    assert len(set(pointers)) == len(pointers), "no buffer shared between two tensors"
    report = loader.last_report
    assert report["tensors"] == 3 and report["backend"] == "host"
    assert report["bytes_read"] == sum(t.nbytes for t in tensors.values()), (
        "the shards, once; no other file"
    )


def test_get_all_weights_gives_every_weight_for_an_in_place_reload(
    vllm: Any, tmp_path: Path
) -> None:
    """vLLM's in-place reload (`reload_weights`) asks the loader for `get_all_weights(
    model_config, model)`; a loader without it makes vLLM raise NotImplementedError."""
    from vllm.config.load import LoadConfig

    import safetensors_staging.vllm as plugin

    tensors = checkpoint(tmp_path / "model")
    loader = plugin.StagingModelLoader(
        LoadConfig(load_format="staging", model_loader_extra_config={"backend": "host"})
    )
    config = ModelConfig(str(tmp_path / "model"))
    loader.download_model(config)
    got = dict(loader.get_all_weights(config, Model()))
    assert sorted(got) == sorted(tensors)
    for name, tensor in got.items():
        assert torch.equal(tensor, tensors[name]), name
    assert loader.last_report["bytes_read"] == sum(t.nbytes for t in tensors.values())


def test_weights_elsewhere_and_ignore_patterns(vllm: Any, tmp_path: Path) -> None:
    from vllm.config.load import LoadConfig

    import safetensors_staging.vllm as plugin

    tensors = checkpoint(tmp_path / "weights")
    (tmp_path / "config-only").mkdir()
    loader = plugin.StagingModelLoader(
        LoadConfig(
            load_format="staging", model_loader_extra_config={"weights": str(tmp_path / "weights")}
        )
    )
    model = Model()
    loader.load_weights(model, ModelConfig(str(tmp_path / "config-only")))
    assert torch.equal(model.embed.weight, tensors["embed.weight"])
    # Without an index, vLLM's ignore patterns decide: here they leave one shard.
    os.remove(tmp_path / "weights" / "model.safetensors.index.json")
    files = plugin.weight_files(str(tmp_path / "weights"), ["consolidated*", "model-00002-*"])
    assert [Path(f).name for f in files] == ["model-00001-of-00002.safetensors"]
    with pytest.raises(ValueError, match="no safetensors weights"):
        plugin.weight_files(str(tmp_path / "config-only"))


def test_unknown_extra_config_keys_and_missing_weights_are_errors(
    vllm: Any, tmp_path: Path
) -> None:
    from vllm.config.load import LoadConfig

    import safetensors_staging.vllm as plugin

    with pytest.raises(
        ValueError,
        match=r"unknown key\(s\) 'memory' .* accepted: weights, share_reads, backend, device_memory",
    ):
        plugin.StagingModelLoader(
            LoadConfig(load_format="staging", model_loader_extra_config={"memory": "1GiB"})
        )
    with pytest.raises(ValueError, match="share_reads' must be true or false"):
        plugin.StagingModelLoader(
            LoadConfig(load_format="staging", model_loader_extra_config={"share_reads": "yes"})
        )
    import safetensors.torch

    (tmp_path / "partial").mkdir()
    safetensors.torch.save_file(
        {"embed.weight": torch.zeros(64, 16)}, tmp_path / "partial" / "model.safetensors"
    )
    loader = plugin.StagingModelLoader(LoadConfig(load_format="staging"))
    with pytest.raises(
        ValueError, match=r"not initialized from checkpoint: \['layer.bias', 'layer.weight'\]"
    ):
        loader.load_weights(Model(), ModelConfig(str(tmp_path / "partial")))
    # A quantized model may leave parameters to its own post-processing.
    loader.load_weights(Model(), ModelConfig(str(tmp_path / "partial"), quantization="fp8"))
    # A bad option of this library is this library's error.
    import safetensors_staging as st

    bad = plugin.StagingModelLoader(
        LoadConfig(load_format="staging", model_loader_extra_config={"threads": 0})
    )
    with pytest.raises(st.InvalidOptionError):
        bad.load_weights(Model(), ModelConfig(str(tmp_path / "partial")))


def test_share_reads_goes_through_the_world_group(vllm: Any, tmp_path: Path) -> None:
    import torch.distributed as dist
    from vllm.config.load import LoadConfig

    import safetensors_staging.vllm as plugin

    tensors = checkpoint(tmp_path / "model")
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0, world_size=1
    )
    try:
        loader = plugin.StagingModelLoader(
            LoadConfig(load_format="staging", model_loader_extra_config={"share_reads": True})
        )
        model = Model()
        loader.load_weights(model, ModelConfig(str(tmp_path / "model")))
    finally:
        dist.destroy_process_group()
    assert torch.equal(model.layer.weight, tensors["layer.weight"])
    assert "bytes_received" in loader.last_report, "the load went through process_group="


# The vLLM symbols the plugin uses, with the parameters it passes or overrides (`*name`: by
# keyword).
USED = [
    ("vllm.model_executor.model_loader", "register_model_loader", ["load_format"]),
    ("vllm.model_executor.model_loader", "get_model_loader", ["load_config"]),
    (
        "vllm.model_executor.model_loader.base_loader",
        "BaseModelLoader.__init__",
        ["self", "load_config"],
    ),
    (
        "vllm.model_executor.model_loader.base_loader",
        "BaseModelLoader.download_model",
        ["self", "model_config"],
    ),
    (
        "vllm.model_executor.model_loader.base_loader",
        "BaseModelLoader.load_weights",
        ["self", "model", "model_config"],
    ),
    (
        "vllm.model_executor.model_loader.weight_utils",
        "download_weights_from_hf",
        ["model_name_or_path", "cache_dir", "allow_patterns", "revision", "*ignore_patterns"],
    ),
    ("vllm.distributed.parallel_state", "get_world_group", []),
]


def _signatures() -> Dict[str, Any]:
    from vllm.config.load import LoadConfig

    return signatures(
        USED,
        LoadConfig,
        {"load_format", "download_dir", "model_loader_extra_config", "ignore_patterns"},
    )


def test_standins_use_what_the_plugin_passes(vllm: Any) -> None:
    got = _signatures()
    for module, name, params in USED:
        assert takes(got[f"{module}:{name}"], params), (module, name)
    assert got["LoadConfig"] == [
        "download_dir",
        "ignore_patterns",
        "load_format",
        "model_loader_extra_config",
    ]


@pytest.mark.skipif(
    not real_importable("vllm"),
    reason="the real vLLM is not installed here (scripts/check-vllm.sh installs it)",
)
def test_standins_have_the_real_signatures() -> None:
    compare_with_real("test_engines_vllm", USED)
