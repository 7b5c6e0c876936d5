"""The SGLang loader class (`safetensors_staging.sglang.StagingModelLoader`) against stand-ins of
the SGLang symbols it uses (`tests/standins/sglang`): SGLang's own `get_model_loader` takes the
class as `load_format`, its default loader's `load_model` builds the model and calls
`model.load_weights` with what this library reads."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, Iterable, List, Set, Tuple

import pytest
import torch

from test_engines_vllm import (
    Model,
    StopAtDevice,
    check_signatures,
    checkpoint,
    compare_with_real,
    imports_nothing_early,
    overrides_take,
    real_importable,
    record_devices,
    signatures,
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

    def __init__(self, model_path: str, quantization: Any = None, hf_config: Any = None) -> None:
        self.model_path, self.revision = model_path, None
        self.quantization, self.hf_config = quantization, hf_config


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


def weight_updater(config: Any, model: Any) -> Any:
    """SGLang's `WeightUpdater` of a server on the CPU running `model`, as its scheduler makes
    one (no CUDA graph to recapture, nothing else to update)."""
    from sglang.srt.model_executor.model_runner_components.weight_updater import WeightUpdater

    return WeightUpdater(
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


def test_update_weights_from_disk_reloads_in_place_as_the_server_was_told(
    sglang: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SGLang's `update_weights_from_disk(path, "staging")` reloads a running model through the
    library, into the parameters it has; its loader, made with no extra config, reads with the
    server's `--model-loader-extra-config`."""
    import safetensors.torch
    import sglang.srt.runtime_context as context
    from sglang.srt.configs.load_config import LoadConfig
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
    updater = weight_updater(config, model)
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


def test_an_update_from_another_path_reads_that_path_not_the_servers_weights(
    sglang: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server started with `weights` elsewhere than its `--model-path`: an update from disk
    from a new path reads the new path (the server's `weights` belong to its `--model-path`);
    an update from the server's own path reads the `weights` again."""
    import safetensors.torch
    import sglang.srt.runtime_context as context
    from sglang.srt.plugins import load_plugins

    load_plugins()
    tensors = checkpoint(tmp_path / "weights")
    (tmp_path / "config-only").mkdir()
    extra = json.dumps({"backend": "host", "weights": str(tmp_path / "weights")})
    server = SimpleNamespace(
        load_format="staging",
        model_loader_extra_config=extra,
        model_path=str(tmp_path / "config-only"),
    )
    monkeypatch.setattr(context, "_server_args", server)
    config = ModelConfig(str(tmp_path / "config-only"))
    model = Model()
    step = {name: tensor * 2 for name, tensor in tensors.items()}
    (tmp_path / "step1").mkdir()
    safetensors.torch.save_file(step, tmp_path / "step1" / "model.safetensors")
    updater = weight_updater(config, model)
    for path, want in [(tmp_path / "step1", step), (tmp_path / "config-only", tensors)]:
        ok, message = updater.update_weights_from_disk(str(path), "staging")
        assert ok, message
        for name, param in model.named_parameters():
            assert torch.equal(param, want[name]), (path, name)


def test_model_checksum_with_streamed_weights_is_refused(
    sglang: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--model-checksum` verifies local files before they are read; weights streamed from a
    URL (or the Hub) are not local files, so the load is refused by name, not unverified."""
    import sglang.srt.runtime_context as context
    from sglang.srt.configs.load_config import LoadConfig

    import safetensors_staging._engines as engines
    import safetensors_staging.sglang as plugin

    reads: List[Any] = []
    monkeypatch.setattr(engines, "stream", lambda source, *rest: reads.append(source))
    monkeypatch.setattr(
        context, "_server_args", SimpleNamespace(model_checksum="sums.json", load_format="auto")
    )
    (tmp_path / "config-only").mkdir()
    for extra, model in [
        ({"weights": "s3://bucket/model"}, str(tmp_path / "config-only")),
        ({}, "org/tiny"),
    ]:
        loader = plugin.StagingModelLoader(
            LoadConfig(load_format=plugin.StagingModelLoader, model_loader_extra_config=extra)
        )
        with pytest.raises(ValueError, match="--model-checksum 'sums.json' verifies local files"):
            loader.load_model(model_config=ModelConfig(model), device_config=DeviceConfig())
    assert reads == []


def sglang_loads(
    load_format: Any, config: Any, model: Any, extra: Any = None
) -> List[Tuple[str, torch.Tensor]]:
    """`(name, tensor)` as SGLang's `load_model` asks the loader of `load_format` for them
    (`_get_all_weights`: the model's own source, then its `secondary_weights`)."""
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.model_loader.loader import get_model_loader

    loader = get_model_loader(
        LoadConfig(load_format=load_format, model_loader_extra_config=extra or {})
    )
    return [(name, tensor.clone()) for name, tensor in loader._get_all_weights(config, model)]


def test_the_files_are_sglangs(sglang: Any, tmp_path: Path) -> None:
    """What the class reads, for each way an SGLang model names its weights, is what SGLang's
    own `safetensors` reads: the same names and bytes (the index's shards, a secondary source
    under its prefix, a model's file patterns within the index, GLM4's `mtp.safetensors`
    beside the index)."""
    import safetensors.torch
    from sglang.srt.model_loader.loader import DefaultModelLoader

    import safetensors_staging.sglang as plugin

    tensors = checkpoint(tmp_path / "model")
    (tmp_path / "vision").mkdir()
    safetensors.torch.save_file(
        {"proj.weight": torch.arange(6.0).reshape(2, 3)}, tmp_path / "vision" / "v.safetensors"
    )
    safetensors.torch.save_file(
        {"model.mtp.layers.0.w": torch.full((3,), 7.0)}, tmp_path / "model" / "mtp.safetensors"
    )
    glm4 = SimpleNamespace(architectures=["Glm4MoeForCausalLM"], num_nextn_predict_layers=1)
    cases = {
        "plain": (ModelConfig(str(tmp_path / "model")), Model()),
        "secondary": (ModelConfig(str(tmp_path / "model")), Model()),
        "patterns": (ModelConfig(str(tmp_path / "model")), Model()),
        "glm4": (ModelConfig(str(tmp_path / "model"), hf_config=glm4), Model()),
    }
    cases["secondary"][1].secondary_weights = [
        DefaultModelLoader.Source(str(tmp_path / "vision"), None, prefix="v.")
    ]
    cases["patterns"][1].allow_patterns_overrides = ["model-00002-*.safetensors"]
    names = {}
    for what, (config, model) in cases.items():
        theirs = sglang_loads("safetensors", config, model)
        ours = sglang_loads(plugin.StagingModelLoader, config, model, {"backend": "host"})
        assert sorted(n for n, _ in ours) == sorted(n for n, _ in theirs), what
        assert len(ours) == len(dict(ours)), "each tensor once"
        want = dict(theirs)
        for name, tensor in ours:
            assert tensor.dtype == want[name].dtype and torch.equal(tensor, want[name]), (
                what,
                name,
            )
        names[what] = dict(ours)
    assert sorted(names["plain"]) == sorted(tensors)
    assert sorted(names["secondary"]) == sorted([*tensors, "v.proj.weight"])
    assert sorted(names["patterns"]) == ["layer.bias", "layer.weight"], "the model's patterns"
    assert sorted(names["glm4"]) == sorted([*tensors, "model.mtp.layers.0.w"])


def test_the_checksum_and_the_file_order_are_sglangs(
    sglang: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--model-checksum` is verified by SGLang before anything is read, and the files are read
    in SGLang's order (`SGLANG_SORT_WEIGHT_FILES`)."""
    import safetensors.torch
    import sglang.srt.runtime_context as context
    from sglang.srt.configs.load_config import LoadConfig, LoadFormat
    from sglang.srt.model_loader import weight_utils
    from sglang.srt.model_loader.loader import DefaultModelLoader

    import safetensors_staging._engines as engines
    import safetensors_staging.sglang as plugin

    model = tmp_path / "model"
    model.mkdir()
    for name in ("b", "c", "a"):
        safetensors.torch.save_file({name: torch.ones(2)}, model / f"{name}.safetensors")
    reads: List[Any] = []
    stream = engines.stream

    def recorded(source: Any, *rest: Any) -> Any:
        reads.append(list(source))
        return stream(source, *rest)

    monkeypatch.setattr(engines, "stream", recorded)
    monkeypatch.setattr(
        context, "_server_args", SimpleNamespace(model_checksum="sums.json", load_format="auto")
    )
    sglangs = DefaultModelLoader(LoadConfig(load_format=LoadFormat.SAFETENSORS))
    for order in ("0", "-1"):
        monkeypatch.setenv("SGLANG_SORT_WEIGHT_FILES", order)
        weight_utils.VERIFIED.clear()
        got = sglang_loads(plugin.StagingModelLoader, ModelConfig(str(model)), Model())
        assert sorted(n for n, _ in got) == ["a", "b", "c"]
        assert weight_utils.VERIFIED == [(str(model), "sums.json")]
        assert reads[-1] == sglangs._prepare_weights(str(model), None, True)[1], order
    assert reads[0] == [str(model / f"{n}.safetensors") for n in "abc"]


def test_the_weight_iterator_takes_what_sglang_passes(sglang: Any, tmp_path: Path) -> None:
    """SGLang's overlapped start-up resolves the files first and passes them with its prefetch
    flags (SGLang 0.5.23 refuses that mode for any loader but its own, but calls its loaders so):
    the class reads the resolved files (and no others); the flags change nothing."""
    from sglang.srt.model_loader.loader import DefaultModelLoader

    import safetensors_staging.sglang as plugin

    tensors = checkpoint(tmp_path / "model")
    loader = plugin.StagingModelLoader(
        SimpleNamespace(
            load_format=plugin.StagingModelLoader,
            download_dir=None,
            model_loader_extra_config={"backend": "host"},
            ignore_patterns=None,
            draft_model_idx=None,
            modelopt_config=None,
        )
    )
    source = DefaultModelLoader.Source(str(tmp_path / "model"), None, prefix="m.")
    second = str(tmp_path / "model" / "model-00002-of-00002.safetensors")
    resolved = DefaultModelLoader.ResolvedSource(source, str(tmp_path / "model"), (second,), True)
    got = dict(
        loader._get_weights_iterator(
            source,
            resolved_source=resolved,
            startup_prefetch_started=True,
            startup_prefetch_active=True,
        )
    )
    assert sorted(got) == ["m.layer.bias", "m.layer.weight"]
    assert torch.equal(got["m.layer.weight"], tensors["layer.weight"])
    assert loader.last_report["bytes_read"] == sum(
        tensors[n].nbytes for n in ("layer.bias", "layer.weight")
    )


def test_a_quantization_sglang_loads_with_a_loader_of_its_own_is_refused(
    sglang: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A class as `load_format` comes before SGLang's choice of `IncModelLoader` and
    `ModelOptModelLoader`: such a model is refused by name, before anything is read; an online
    `modelopt_fp4` quantization (no ModelOpt workflow) stays with the default loader, as in
    SGLang."""
    from sglang.srt.configs.load_config import LoadConfig

    import safetensors_staging._engines as engines
    import safetensors_staging.sglang as plugin

    tensors = checkpoint(tmp_path / "model")
    reads: List[Any] = []
    stream = engines.stream
    monkeypatch.setattr(
        engines, "stream", lambda source, *rest: reads.append(source) or stream(source, *rest)
    )
    loader = plugin.StagingModelLoader(LoadConfig(load_format=plugin.StagingModelLoader))
    for quantization, own in [
        ("auto-round-int8", "IncModelLoader"),
        ("modelopt_fp8", "ModelOptModelLoader"),
        ("modelopt_fp4", "ModelOptModelLoader"),  # already quantized: ModelOpt's checkpoint
    ]:
        config = ModelConfig(str(tmp_path / "model"), quantization=quantization)
        with pytest.raises(ValueError, match=f"{quantization}.*{own}.*--load-format auto"):
            loader.load_model(model_config=config, device_config=DeviceConfig())
    assert reads == []
    online = ModelConfig(str(tmp_path / "model"), quantization="modelopt_fp4")
    online._is_already_quantized = lambda: False
    model = loader.load_model(model_config=online, device_config=DeviceConfig())
    assert torch.equal(model.layer.weight, tensors["layer.weight"])
    # ... unless a ModelOpt workflow is asked for (SGLang's ModelOptModelLoader again).
    workflow = plugin.StagingModelLoader(
        LoadConfig(
            load_format=plugin.StagingModelLoader,
            modelopt_config=SimpleNamespace(
                checkpoint_restore_path=None, checkpoint_save_path="out", export_path=None
            ),
        )
    )
    with pytest.raises(ValueError, match="ModelOptModelLoader"):
        workflow.load_model(model_config=online, device_config=DeviceConfig())


def test_a_register_that_cannot_hook_fails_loudly_and_offers_nothing(
    sglang: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SGLang only logs a plugin's failure: `register` raises naming what failed, and
    `staging` is not offered as a choice without the hook that makes it the class."""
    from sglang.srt.arg_groups.choices import LOAD_FORMAT_CHOICES
    from sglang.srt.plugins.hook_registry import HookRegistry

    import safetensors_staging.sglang as plugin

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AttributeError("no attribute '_verify_load_format'")

    with monkeypatch.context() as patched:
        patched.setattr(HookRegistry, "register", classmethod(refuse))
        with pytest.raises(
            RuntimeError,
            match=r"cannot register load format 'staging' with this SGLang .*AttributeError: no "
            r"attribute '_verify_load_format'.*--load-format staging is not available",
        ):
            plugin.register()
    assert "staging" not in LOAD_FORMAT_CHOICES
    assert plugin._registered is False
    plugin.register()  # the registry works again: the next call registers
    assert LOAD_FORMAT_CHOICES.count("staging") == 1


class Reader(torch.nn.Module):
    """A model with no parameters of its own (nothing is built on the absent GPU) that reads
    every weight it is given."""

    def __init__(self, config: Any = None, quant_config: Any = None) -> None:
        super().__init__()

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> Set[str]:
        return {name for name, _ in weights}


def test_tensors_go_to_sglangs_device(
    sglang: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`device_config.device` for a load, the server's `--device` for an update from disk; a
    device other than a GPU gets host tensors (SGLang's own loader gives host tensors for the
    model to copy)."""
    import sglang.srt.runtime_context as context
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.model_loader.loader import DefaultModelLoader

    import safetensors_staging.sglang as plugin

    checkpoint(tmp_path / "model")
    asked = record_devices(monkeypatch)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)  # `cuda` alone: the current GPU
    config = ModelConfig(str(tmp_path / "model"))
    config.model_class = Reader
    loader = plugin.StagingModelLoader(LoadConfig(load_format=plugin.StagingModelLoader))
    for device, expected in [("cuda:2", "cuda:2"), ("cuda", "cuda:0"), ("xpu", "cpu")]:
        with pytest.raises(StopAtDevice):
            loader.load_model(model_config=config, device_config=SimpleNamespace(device=device))
        assert asked[-1] == expected, device
    monkeypatch.setattr(context, "_server_args", SimpleNamespace(device="cuda:1"))
    with pytest.raises(StopAtDevice):
        list(loader._get_weights_iterator(DefaultModelLoader.Source(config.model_path, None)))
    assert asked[-1] == "cuda:1"


def test_a_hub_model_s_weights_are_read_at_the_commit_of_its_config(
    sglang: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where SGLang's config says which commit it was read at (`_commit_hash`), the model's
    weights stream from that commit, not from whatever its revision names by then."""
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.model_loader.loader import DefaultModelLoader

    import safetensors_staging._engines as engines
    import safetensors_staging.sglang as plugin

    asked: List[Any] = []

    def stream(source: Any, *rest: Any) -> Any:
        asked.append(source)
        raise StopAtDevice

    monkeypatch.setattr(engines, "stream", stream)
    commit = "89abcdef0123456789abcdef0123456789abcdef"
    config = ModelConfig("org/tiny", hf_config=SimpleNamespace(_commit_hash=commit.upper()))
    config.model_class = Reader
    loader = plugin.StagingModelLoader(LoadConfig(load_format=plugin.StagingModelLoader))
    with pytest.raises(StopAtDevice):
        loader.load_model(model_config=config, device_config=SimpleNamespace(device="cpu"))
    assert asked == [f"hf://org/tiny@{commit}"]
    with pytest.raises(StopAtDevice):
        list(loader._get_weights_iterator(DefaultModelLoader.Source("org/other", None)))
    assert asked[-1] == "hf://org/other@main", "another model: its own revision"


# The SGLang symbols the plugin uses, with the parameters it passes (`*name`: by keyword).
_LOADER = "sglang.srt.model_loader.loader"
USED = [
    (_LOADER, "DefaultModelLoader.__init__", ["self", "load_config"]),
    (
        _LOADER,
        "DefaultModelLoader._prepare_weights",
        ["self", "model_name_or_path", "revision", "fall_back_to_pt", "allow_patterns_overrides"],
    ),
    (_LOADER, "DefaultModelLoader.load_model", ["self", "*model_config", "*device_config"]),
    (
        _LOADER,
        "DefaultModelLoader._filter_mtp_weights",
        ["weights_iterator", "prefix", "draft_model_idx"],
    ),
    (
        _LOADER,
        "DefaultModelLoader.Source",
        ["model_or_path", "revision", "prefix", "fall_back_to_pt", "allow_patterns_overrides"],
    ),
    (_LOADER, "DefaultModelLoader.ResolvedSource", ["source", "hf_folder", "weight_files"]),
    (_LOADER, "get_model_loader", ["load_config"]),
    (
        "sglang.srt.model_loader.weight_utils",
        "maybe_add_mtp_safetensors",
        ["hf_weights_files", "hf_folder", "index_file", "hf_config"],
    ),
    ("sglang.srt.distributed.parallel_state", "get_world_group", []),
    ("sglang.srt.plugins", "load_plugins", []),
    ("sglang.srt.plugins.hook_registry", "HookRegistry.register", ["target", "hook", "hook_type"]),
    ("sglang.srt.plugins.hook_registry", "HookRegistry.apply_hooks", []),
    ("sglang.srt.arg_groups.choices", "add_load_format_choices", ["iterable"]),
    ("sglang.srt.configs.load_config", "LoadConfig._verify_load_format", ["self"]),
    ("sglang.srt.runtime_context", "get_server_args", []),
    (
        "sglang.srt.model_executor.model_runner_components.weight_updater",
        "WeightUpdater.update_weights_from_disk",
        ["self", "model_path", "load_format"],
    ),
]
# What SGLang calls on the plugin's loader that it overrides, checked against SGLang's own
# `DefaultModelLoader`.
OVERRIDDEN = (
    _LOADER,
    "DefaultModelLoader",
    ["__init__", "_prepare_weights", "_get_weights_iterator", "download_model", "load_model"],
)
# What the plugin reads of the state SGLang's `DefaultModelLoader` keeps.
STATE = ["counter_before_loading_weights"]


def _signatures() -> Dict[str, Any]:
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.model_loader.loader import DefaultModelLoader

    out = signatures(
        USED,
        LoadConfig,
        {
            "load_format",
            "download_dir",
            "model_loader_extra_config",
            "ignore_patterns",
            "draft_model_idx",
            "modelopt_config",
        },
        OVERRIDDEN,
    )
    out["state"] = [name for name in STATE if hasattr(DefaultModelLoader, name)]
    return out


def test_standins_use_what_the_plugin_passes_and_take_what_sglang_passes(sglang: Any) -> None:
    got = _signatures()
    check_signatures(got, USED)
    assert len(got["LoadConfig"]) == 6
    assert got["state"] == STATE
    # The check can fail: the one-argument iterator this plugin had (SGLang passes more).
    engine = got["override:_get_weights_iterator"]["engine"]
    assert not overrides_take(
        engine, [["self", "POSITIONAL_OR_KEYWORD"], ["source", "POSITIONAL_OR_KEYWORD"]]
    )


@pytest.mark.skipif(
    not real_importable("sglang"),
    reason="the real SGLang is not installed here (scripts/check-sglang.sh installs it)",
)
def test_standins_have_the_real_signatures() -> None:
    compare_with_real("test_engines_sglang", USED)
    code = (
        f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
        "from test_engines_sglang import _signatures; print(json.dumps(_signatures()['state']))"
    )
    real = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert json.loads(real.stdout.strip().splitlines()[-1]) == STATE, real.stderr[-2000:]
