"""The SGLang loader class (`safetensors_staging.sglang.StagingModelLoader`) against stand-ins of
the SGLang symbols it uses (`tests/standins/sglang`): SGLang's own `get_model_loader` takes the
class as `load_format`, its default loader's `load_model` builds the model and calls
`model.load_weights` with what this library reads."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Any, Dict, Iterable

import pytest
import torch

from test_engines_vllm import (
    Model,
    checkpoint,
    compare_with_real,
    imports_nothing_early,
    real_importable,
    signatures,
    takes,
    use_standin,
)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture
def sglang(monkeypatch: pytest.MonkeyPatch) -> Iterable[Any]:
    yield from use_standin(monkeypatch, "sglang")


class SglangModel(Model):
    def __init__(self, config: Any = None, quant_config: Any = None) -> None:
        super().__init__()


class ModelConfig:
    model_class = SglangModel
    hf_config = None

    def __init__(self, model_path: str) -> None:
        self.model_path, self.revision = model_path, None


class DeviceConfig:
    device = "cpu"


def test_importing_the_module_imports_neither_sglang_nor_torch() -> None:
    imports_nothing_early("safetensors_staging.sglang", "sglang")


def test_sglang_loads_the_model_through_the_class(sglang: Any, tmp_path: Path) -> None:
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.model_loader.loader import get_model_loader

    import safetensors_staging.sglang as plugin

    tensors = checkpoint(tmp_path / "model")
    config = LoadConfig(
        load_format=plugin.StagingModelLoader,
        model_loader_extra_config={"backend": "host", "chunk_size": "4KiB"},
        ignore_patterns=["consolidated*"],
    )
    loader = get_model_loader(config)
    assert type(loader) is plugin.StagingModelLoader
    loader.download_model(ModelConfig(str(tmp_path / "model")))
    model = loader.load_model(
        model_config=ModelConfig(str(tmp_path / "model")), device_config=DeviceConfig()
    )
    assert not model.training
    for name, param in model.named_parameters():
        assert torch.equal(param, tensors[name]), name
    for name, tensor in model.kept:
        assert torch.equal(tensor, tensors[name]), f"{name} changed after the load moved on"
    assert loader.last_report["tensors"] == 3
    assert loader.last_report["bytes_read"] == sum(t.nbytes for t in tensors.values())


def test_weights_elsewhere_draft_layers_and_bad_keys(sglang: Any, tmp_path: Path) -> None:
    import safetensors.torch
    from sglang.srt.configs.load_config import LoadConfig

    import safetensors_staging.sglang as plugin

    tensors = checkpoint(tmp_path / "weights")
    (tmp_path / "config-only").mkdir()
    loader = plugin.StagingModelLoader(
        LoadConfig(
            load_format=plugin.StagingModelLoader,
            model_loader_extra_config={"weights": str(tmp_path / "weights")},
        )
    )
    model = loader.load_model(
        model_config=ModelConfig(str(tmp_path / "config-only")), device_config=DeviceConfig()
    )
    assert torch.equal(model.layer.weight, tensors["layer.weight"])
    # A draft model keeps its own MTP layer, renamed to layer 0, as SGLang's default loader does.
    mtp = tmp_path / "mtp"
    mtp.mkdir()
    safetensors.torch.save_file(
        {
            "model.mtp.layers.0.w": torch.zeros(2),
            "model.mtp.layers.1.w": torch.ones(2),
            "model.norm": torch.full((2,), 3.0),
        },
        mtp / "model.safetensors",
    )
    draft = plugin.StagingModelLoader(
        LoadConfig(load_format=plugin.StagingModelLoader, draft_model_idx=1)
    )
    from sglang.srt.model_loader.loader import DefaultModelLoader

    got = dict(draft._get_weights_iterator(DefaultModelLoader.Source(str(mtp), None, prefix="p.")))
    assert sorted(got) == ["p.model.mtp.layers.0.w", "p.model.norm"]
    assert torch.equal(got["p.model.mtp.layers.0.w"], torch.ones(2))
    with pytest.raises(ValueError, match=r"unknown key\(s\) 'num_threads'.*accepted: weights"):
        plugin.StagingModelLoader(
            LoadConfig(
                load_format=plugin.StagingModelLoader, model_loader_extra_config={"num_threads": 4}
            )
        )


def test_the_plugin_makes_load_format_staging_the_class(sglang: Any, tmp_path: Path) -> None:
    (entry,) = [
        e
        for e in importlib.metadata.entry_points(group="sglang.srt.plugins")
        if e.value.startswith("safetensors_staging.")
    ]
    assert entry.value == "safetensors_staging.sglang:register"
    from sglang.srt.arg_groups.choices import LOAD_FORMAT_CHOICES
    from sglang.srt.configs.load_config import LoadConfig, LoadFormat
    from sglang.srt.model_loader.loader import get_model_loader
    from sglang.srt.plugins import load_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry

    with pytest.raises(ValueError, match="'staging' is not a valid LoadFormat"):
        LoadConfig(load_format="staging")  # SGLang alone refuses the string
    assert "staging" not in LOAD_FORMAT_CHOICES
    load_plugins()  # what SGLang does first in each process: our entry point, then the hooks
    entry.load()()  # a second call in the same process changes nothing
    import safetensors_staging.sglang as plugin

    assert LOAD_FORMAT_CHOICES.count("staging") == 1
    assert (
        len(HookRegistry._hooks["sglang.srt.configs.load_config.LoadConfig._verify_load_format"])
        == 1
    )
    tensors = checkpoint(tmp_path / "model")
    config = LoadConfig(
        load_format="Staging",
        model_loader_extra_config={"backend": "host"},
        ignore_patterns=["consolidated*"],
    )
    assert config.load_format is plugin.StagingModelLoader
    loader = get_model_loader(config)
    assert type(loader) is plugin.StagingModelLoader
    model = loader.load_model(
        model_config=ModelConfig(str(tmp_path / "model")), device_config=DeviceConfig()
    )
    for name, param in model.named_parameters():
        assert torch.equal(param, tensors[name]), name
    assert loader.last_report["bytes_read"] == sum(t.nbytes for t in tensors.values())
    # SGLang's own formats, and its refusal of unknown ones, are left to SGLang.
    assert LoadConfig(load_format="SafeTensors").load_format is LoadFormat.SAFETENSORS
    assert LoadConfig(load_format=LoadFormat.DUMMY).load_format is LoadFormat.DUMMY
    with pytest.raises(ValueError, match="'stagingx' is not a valid LoadFormat"):
        LoadConfig(load_format="stagingx")
    with pytest.raises(ValueError, match=r"unknown key\(s\) 'num_threads'"):
        get_model_loader(
            LoadConfig(load_format="staging", model_loader_extra_config={"num_threads": 4})
        )


def test_update_weights_from_disk_reloads_in_place_as_the_server_was_told(
    sglang: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SGLang's `update_weights_from_disk(path, "staging")` reloads a running model through the
    library, into the parameters it has; its loader, made with no extra config, reads with the
    server's `--model-loader-extra-config`."""
    import safetensors.torch
    import sglang.srt.runtime_context as context
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.model_executor.model_runner_components.weight_updater import WeightUpdater
    from sglang.srt.model_loader.loader import get_model_loader
    from sglang.srt.plugins import load_plugins

    import safetensors_staging._engines as engines

    load_plugins()
    server_config = '{"backend": "host", "chunk_size": "4KiB"}'
    server = type(
        "ServerArgs", (), {"load_format": "staging", "model_loader_extra_config": server_config}
    )
    monkeypatch.setattr(context, "_server_args", server)
    first = checkpoint(tmp_path / "model")
    config = ModelConfig(str(tmp_path / "model"))
    loader = get_model_loader(
        LoadConfig(load_format="staging", model_loader_extra_config=server_config)
    )
    model = loader.load_model(model_config=config, device_config=DeviceConfig())
    memory = {name: param.data_ptr() for name, param in model.named_parameters()}
    # One training step later.
    step = {name: tensor * 2 for name, tensor in first.items()}
    (tmp_path / "step1").mkdir()
    safetensors.torch.save_file(step, tmp_path / "step1" / "model.safetensors")
    reads = []
    stream = engines.stream

    def recorded(source: Any, device: str, options: Dict[str, Any], *rest: Any) -> Any:
        reads.append((source, options))
        return stream(source, device, options, *rest)

    monkeypatch.setattr(engines, "stream", recorded)
    updater = WeightUpdater(
        tp_rank=0,
        device="cpu",
        gpu_id=0,
        model_config=config,
        custom_weight_loaders={},
        get_model=lambda: model,
        update_model_fields=lambda *args, **kwargs: None,
        recapture_cuda_graph=lambda: None,
        get_model_runner=lambda: None,
    )
    ok, message = updater.update_weights_from_disk(str(tmp_path / "step1"), "staging")
    assert ok, message
    for name, param in model.named_parameters():
        assert torch.equal(param, step[name]), name
        assert param.data_ptr() == memory[name], f"{name} was not reloaded in place"
    assert reads == [
        ([str(tmp_path / "step1" / "model.safetensors")], {"backend": "host", "chunk_size": "4KiB"})
    ]
    # A loader given an extra config of its own reads with that one.
    own = get_model_loader(
        LoadConfig(load_format="staging", model_loader_extra_config={"threads": 1})
    )
    assert own.options == {"threads": 1}
    # A server started with another format keeps its extra config (its keys are not ours).
    server.load_format = "safetensors"
    server.model_loader_extra_config = '{"enable_multithread_load": true}'
    other = get_model_loader(LoadConfig(load_format="staging"))
    assert other.options == {}


USED = [
    ("sglang.srt.model_loader.loader", "BaseModelLoader.__init__", ["self", "load_config"]),
    (
        "sglang.srt.model_loader.loader",
        "DefaultModelLoader._get_weights_iterator",
        ["self", "source"],
    ),
    (
        "sglang.srt.model_loader.loader",
        "DefaultModelLoader._get_all_weights",
        ["self", "model_config", "model"],
    ),
    (
        "sglang.srt.model_loader.loader",
        "DefaultModelLoader._filter_mtp_weights",
        ["weights_iterator", "prefix", "draft_model_idx"],
    ),
    (
        "sglang.srt.model_loader.loader",
        "DefaultModelLoader.load_model",
        ["self", "model_config", "device_config"],
    ),
    (
        "sglang.srt.model_loader.loader",
        "DefaultModelLoader.Source",
        ["model_or_path", "revision", "prefix"],
    ),
    ("sglang.srt.model_loader.loader", "get_model_loader", ["load_config"]),
    (
        "sglang.srt.model_loader.weight_utils",
        "download_weights_from_hf",
        ["model_name_or_path", "cache_dir", "allow_patterns", "revision", "*ignore_patterns"],
    ),
    ("sglang.srt.distributed.parallel_state", "get_world_group", []),
    ("sglang.srt.plugins", "load_plugins", []),
    ("sglang.srt.plugins.hook_registry", "HookRegistry.register", ["target", "hook", "hook_type"]),
    ("sglang.srt.plugins.hook_registry", "HookRegistry.apply_hooks", []),
    ("sglang.srt.configs.load_config", "LoadConfig._verify_load_format", ["self"]),
    ("sglang.srt.runtime_context", "get_server_args", []),
    (
        "sglang.srt.model_executor.model_runner_components.weight_updater",
        "WeightUpdater.update_weights_from_disk",
        ["self", "model_path", "load_format"],
    ),
]


def _signatures() -> Dict[str, Any]:
    from sglang.srt.configs.load_config import LoadConfig

    return signatures(
        USED,
        LoadConfig,
        {
            "load_format",
            "download_dir",
            "model_loader_extra_config",
            "ignore_patterns",
            "draft_model_idx",
        },
    )


def test_standins_use_what_the_loader_passes(sglang: Any) -> None:
    got = _signatures()
    for module, name, params in USED:
        assert takes(got[f"{module}:{name}"], params), (module, name)
    assert len(got["LoadConfig"]) == 5


@pytest.mark.skipif(not real_importable("sglang"), reason="the real SGLang is not installed here")
def test_standins_have_the_real_signatures() -> None:
    compare_with_real("test_engines_sglang", USED)
