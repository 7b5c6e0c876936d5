"""The SGLang loader class (`safetensors_staging.sglang.StagingModelLoader`) against stand-ins of
the SGLang symbols it uses (`tests/standins/sglang`): SGLang's own `get_model_loader` takes the
class as `load_format`, its default loader's `load_model` builds the model and calls
`model.load_weights` with what this library reads."""

from __future__ import annotations

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
    import safetensors_staging.sglang as plugin
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.model_loader.loader import get_model_loader

    tensors = checkpoint(tmp_path / "model")
    config = LoadConfig(load_format=plugin.StagingModelLoader,
                        model_loader_extra_config={"backend": "host", "chunk_size": "4KiB"},
                        ignore_patterns=["consolidated*"])
    loader = get_model_loader(config)
    assert type(loader) is plugin.StagingModelLoader
    loader.download_model(ModelConfig(str(tmp_path / "model")))
    model = loader.load_model(model_config=ModelConfig(str(tmp_path / "model")), device_config=DeviceConfig())
    assert not model.training
    for name, param in model.named_parameters():
        assert torch.equal(param, tensors[name]), name
    for name, tensor in model.kept:
        assert torch.equal(tensor, tensors[name]), f"{name} changed after the load moved on"
    assert loader.last_report["tensors"] == 3
    assert loader.last_report["bytes_read"] == sum(t.nbytes for t in tensors.values())


def test_weights_elsewhere_draft_layers_and_bad_keys(sglang: Any, tmp_path: Path) -> None:
    import safetensors.torch

    import safetensors_staging.sglang as plugin
    from sglang.srt.configs.load_config import LoadConfig

    tensors = checkpoint(tmp_path / "weights")
    (tmp_path / "config-only").mkdir()
    loader = plugin.StagingModelLoader(LoadConfig(load_format=plugin.StagingModelLoader,
                                                  model_loader_extra_config={"weights": str(tmp_path / "weights")}))
    model = loader.load_model(model_config=ModelConfig(str(tmp_path / "config-only")), device_config=DeviceConfig())
    assert torch.equal(model.layer.weight, tensors["layer.weight"])
    # A draft model keeps its own MTP layer, renamed to layer 0, as SGLang's default loader does.
    mtp = tmp_path / "mtp"
    mtp.mkdir()
    safetensors.torch.save_file({"model.mtp.layers.0.w": torch.zeros(2), "model.mtp.layers.1.w": torch.ones(2),
                                 "model.norm": torch.full((2,), 3.0)}, mtp / "model.safetensors")
    draft = plugin.StagingModelLoader(LoadConfig(load_format=plugin.StagingModelLoader, draft_model_idx=1))
    from sglang.srt.model_loader.loader import DefaultModelLoader

    got = dict(draft._get_weights_iterator(DefaultModelLoader.Source(str(mtp), None, prefix="p.")))
    assert sorted(got) == ["p.model.mtp.layers.0.w", "p.model.norm"]
    assert torch.equal(got["p.model.mtp.layers.0.w"], torch.ones(2))
    with pytest.raises(ValueError, match=r"unknown key\(s\) 'num_threads'.*accepted: weights"):
        plugin.StagingModelLoader(LoadConfig(load_format=plugin.StagingModelLoader,
                                             model_loader_extra_config={"num_threads": 4}))


USED = [
    ("sglang.srt.model_loader.loader", "BaseModelLoader.__init__", ["self", "load_config"]),
    ("sglang.srt.model_loader.loader", "DefaultModelLoader._get_weights_iterator", ["self", "source"]),
    ("sglang.srt.model_loader.loader", "DefaultModelLoader._get_all_weights", ["self", "model_config", "model"]),
    ("sglang.srt.model_loader.loader", "DefaultModelLoader._filter_mtp_weights",
     ["weights_iterator", "prefix", "draft_model_idx"]),
    ("sglang.srt.model_loader.loader", "DefaultModelLoader.load_model", ["self", "model_config", "device_config"]),
    ("sglang.srt.model_loader.loader", "DefaultModelLoader.Source", ["model_or_path", "revision", "prefix"]),
    ("sglang.srt.model_loader.loader", "get_model_loader", ["load_config"]),
    ("sglang.srt.model_loader.weight_utils", "download_weights_from_hf",
     ["model_name_or_path", "cache_dir", "allow_patterns", "revision", "*ignore_patterns"]),
    ("sglang.srt.distributed.parallel_state", "get_world_group", []),
]


def _signatures() -> Dict[str, Any]:
    from sglang.srt.configs.load_config import LoadConfig

    return signatures(USED, LoadConfig, {"load_format", "download_dir", "model_loader_extra_config",
                                         "ignore_patterns", "draft_model_idx"})


def test_standins_use_what_the_loader_passes(sglang: Any) -> None:
    got = _signatures()
    for module, name, params in USED:
        assert takes(got[f"{module}:{name}"], params), (module, name)
    assert len(got["LoadConfig"]) == 5


@pytest.mark.skipif(not real_importable("sglang"), reason="the real SGLang is not installed here")
def test_standins_have_the_real_signatures() -> None:
    compare_with_real("test_engines_sglang", USED)
