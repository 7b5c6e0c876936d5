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

STANDINS = Path(__file__).parents[1] / "standins"


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
    used: List[Tuple[str, str, List[str]]],
    load_config: Any,
    fields: Set[str],
    overridden: Tuple[str, str, List[str]] = ("", "", []),
) -> Dict[str, Any]:
    """The parameter names of each symbol `used`, which of `fields` `load_config` has, and, for
    `overridden` (the engine's module and class, and the methods the plugin's
    `StagingModelLoader` overrides), each method's parameters in the engine's class and in ours
    (`[name, kind]`)."""
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
    module, base_name, methods = overridden
    if methods:
        engine = importlib.import_module(module)
        base = getattr(engine, base_name)
        plugin = importlib.import_module(f"safetensors_staging.{module.split('.')[0]}")
        ours = plugin.StagingModelLoader
        assert issubclass(ours, base), f"the plugin's loader is the engine's {base_name}"
        for method in methods:
            out[f"override:{method}"] = {
                side: [
                    [p.name, p.kind.name]
                    for p in inspect.signature(getattr(cls, method)).parameters.values()
                ]
                for side, cls in (("engine", base), ("ours", ours))
            }
    return out


def overrides_take(engine: List[List[str]], ours: List[List[str]]) -> bool:
    """Whether a method of parameters `ours` takes every call the engine makes to its own of
    parameters `engine`: each positional parameter at its place (or `*args`), each keyword one
    by name (or `**kwargs`)."""
    kinds = {kind for _, kind in ours}
    if {"VAR_POSITIONAL", "VAR_KEYWORD"} <= kinds:
        return True
    positional = [n for n, k in ours if k in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")]
    by_name = {n for n, k in ours if k in ("POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY")}
    engine_positional = [n for n, k in engine if k in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")]
    if positional[: len(engine_positional)] != engine_positional:
        return False
    keyword = [n for n, k in engine if k == "KEYWORD_ONLY"]
    return all(n in by_name for n in keyword) or "VAR_KEYWORD" in kinds


def check_signatures(got: Dict[str, Any], used: List[Tuple[str, str, List[str]]]) -> None:
    """Both directions: every symbol takes what the plugin passes, and every override takes
    what the engine passes to it."""
    for module, name, params in used:
        assert takes(got[f"{module}:{name}"], params), (module, name, got[f"{module}:{name}"])
    for key, sides in got.items():
        if key.startswith("override:"):
            assert overrides_take(sides["engine"], sides["ours"]), (key, sides)


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
    check_signatures(real_sigs, used)
    check_signatures(stand_in, used)
    assert real_sigs["LoadConfig"] == stand_in["LoadConfig"]
    # The stand-in's methods the plugin overrides are called as the engine's are.
    for key in real_sigs:
        if key.startswith("override:"):
            assert stand_in[key]["engine"] == real_sigs[key]["engine"], key


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


class StopAtDevice(Exception):
    """Raised by `record_devices`' stand-in for `stream`: the device asked for is the point."""


def record_devices(monkeypatch: pytest.MonkeyPatch) -> List[str]:
    """The devices the plugins' reads ask `_engines.stream` for, in order; each read stops
    there with `StopAtDevice` (no GPU here)."""
    import safetensors_staging._engines as engines

    asked: List[str] = []

    def stream(source: Any, device: str, *args: Any) -> Any:
        asked.append(device)
        raise StopAtDevice

    monkeypatch.setattr(engines, "stream", stream)
    return asked


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


def vllm_loads(
    load_format: str, config: Any, model: Any, extra: Any = None
) -> List[Tuple[str, torch.Tensor]]:
    """`(name, tensor)` as vLLM's in-place reload asks the loader of `load_format` for them."""
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader import get_model_loader

    import safetensors_staging.vllm as plugin

    plugin.register()
    loader = get_model_loader(
        LoadConfig(load_format=load_format, model_loader_extra_config=extra or {})
    )
    return [(name, tensor.clone()) for name, tensor in loader.get_all_weights(config, model)]


def test_the_files_and_filters_are_vllms(vllm: Any, tmp_path: Path) -> None:
    """What `staging` reads, for each way a vLLM model names its weights, is what vLLM's own
    `safetensors` reads: the same names and bytes, each file choice and filter vLLM's. (The
    order differs: this library hands out each file's tensors in file order, vLLM's reader in
    name order; a model's `load_weights` takes them by name.)"""
    import safetensors.torch

    tensors = checkpoint(tmp_path / "model")
    config = ModelConfig(str(tmp_path / "model"))
    # A model with weights in a subfolder of its own and a prefix (secondary_weights), a
    # file pattern of its own, and shards it says it does not use.
    (tmp_path / "model" / "vision").mkdir()
    safetensors.torch.save_file(
        {"proj.weight": torch.arange(6.0).reshape(2, 3)},
        tmp_path / "model" / "vision" / "extra.safetensors",
    )
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    models = {
        "plain": Model(),
        "secondary": Model(),
        "patterns": Model(),
        "unused": Model(),
    }
    models["secondary"].secondary_weights = [
        DefaultModelLoader.Source(str(tmp_path / "model"), None, subfolder="vision", prefix="v.")
    ]
    models["patterns"].allow_patterns_overrides = ["consolidated.safetensors"]
    models["unused"].is_unused_checkpoint_weight = lambda name: name.startswith("embed")
    for what, model in models.items():
        theirs = vllm_loads("safetensors", config, model)
        ours = vllm_loads("staging", config, model, {"backend": "host"})
        assert sorted(n for n, _ in ours) == sorted(n for n, _ in theirs), what
        assert len(ours) == len(dict(ours)), "each tensor once"
        want = dict(theirs)
        for name, tensor in ours:
            assert tensor.dtype == want[name].dtype and torch.equal(tensor, want[name]), (
                what,
                name,
            )
    # What each read: the shards named by the index (not the consolidated copy of zeros, nor
    # `original/`), the subfolder's file under its prefix, the pattern's file alone, and the
    # shard of the unused embedding left out.
    names = {what: [n for n, _ in vllm_loads("staging", config, m)] for what, m in models.items()}
    assert sorted(names["plain"]) == sorted(tensors)
    assert sorted(names["secondary"]) == sorted([*tensors, "v.proj.weight"])
    got = dict(vllm_loads("staging", config, models["patterns"]))
    assert all(not t.any() for t in got.values()), "the consolidated copy, as the pattern says"
    assert sorted(names["unused"]) == ["layer.bias", "layer.weight"]


def test_weights_elsewhere_are_chosen_as_vllm_chooses_a_model_directory(
    vllm: Any, tmp_path: Path
) -> None:
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
    config = ModelConfig(str(tmp_path / "config-only"))
    loader.download_model(config)
    loader.load_weights(model, config)
    for name, tensor in tensors.items():
        assert torch.equal(dict(model.named_parameters())[name], tensor), name
    assert loader.last_report["bytes_read"] == sum(t.nbytes for t in tensors.values())
    # A directory without safetensors is vLLM's error.
    empty = plugin.StagingModelLoader(
        LoadConfig(
            load_format="staging",
            model_loader_extra_config={"weights": str(tmp_path / "config-only")},
        )
    )
    with pytest.raises(RuntimeError, match="Cannot find any model weights"):
        empty.load_weights(Model(), config)


class Quantized(torch.nn.Module):
    """A layer whose quantization method makes its scale after loading (a checkpoint need not
    hold it): vLLM's check for missing weights leaves such a module's parameters alone."""

    class Method:
        def process_weights_after_loading(self, layer: Any) -> None:
            pass

    def __init__(self) -> None:
        super().__init__()
        self.quant_method = self.Method()
        self.scale = torch.nn.Parameter(torch.ones(1))


class ModelWithScale(Model):
    def __init__(self) -> None:
        super().__init__()
        self.q = Quantized()


def test_missing_weights_are_checked_as_vllm_checks_them(vllm: Any, tmp_path: Path) -> None:
    import safetensors.torch
    from vllm.config.load import LoadConfig

    import safetensors_staging.vllm as plugin

    checkpoint(tmp_path / "model")
    config = ModelConfig(str(tmp_path / "model"))
    (tmp_path / "partial").mkdir()
    safetensors.torch.save_file(
        {"embed.weight": torch.zeros(64, 16)}, tmp_path / "partial" / "model.safetensors"
    )
    partial = ModelConfig(str(tmp_path / "partial"))

    def outcome(load_format: str, model: Any, config: Any, extra: Any = None) -> str:
        from vllm.model_executor.model_loader import get_model_loader

        plugin.register()
        loader = get_model_loader(
            LoadConfig(load_format=load_format, model_loader_extra_config=extra or {})
        )
        try:
            loader.load_weights(model, config)
        except ValueError as e:
            return str(e)
        return "loaded"

    cases = [
        # A parameter of a module that makes it after loading is exempt (vLLM's rule).
        (ModelWithScale, config, None, "loaded"),
        # One the checkpoint lacks is an error...
        (Model, partial, None, "not initialized from checkpoint"),
        # ...unless vLLM's own key turns the check off, or the model is quantized.
        (Model, partial, {"enable_weights_track": False}, "loaded"),
        (Model, ModelConfig(str(tmp_path / "partial"), quantization="fp8"), None, "loaded"),
    ]
    for model_class, cfg, extra, expected in cases:
        theirs = outcome("safetensors", model_class(), cfg, extra)
        ours = outcome("staging", model_class(), cfg, extra)
        assert expected in theirs and expected in ours, (model_class, extra, theirs, ours)
        assert ours == theirs


def test_unknown_extra_config_keys_are_errors_naming_what_is_accepted(vllm: Any) -> None:
    from vllm.config.load import LoadConfig

    import safetensors_staging.vllm as plugin

    for key in ("memory", "enable_multithread_load"):
        with pytest.raises(
            ValueError,
            match=rf"unknown key\(s\) '{key}' .* accepted: weights, share_reads, backend, "
            r"device_memory.*, enable_weights_track",
        ):
            plugin.StagingModelLoader(
                LoadConfig(load_format="staging", model_loader_extra_config={key: 1})
            )
    with pytest.raises(ValueError, match="share_reads' must be true or false"):
        plugin.StagingModelLoader(
            LoadConfig(load_format="staging", model_loader_extra_config={"share_reads": "yes"})
        )


def test_a_bad_option_of_this_library_is_this_librarys_error(vllm: Any, tmp_path: Path) -> None:
    from vllm.config.load import LoadConfig

    import safetensors_staging as st
    import safetensors_staging.vllm as plugin

    checkpoint(tmp_path / "model")
    bad = plugin.StagingModelLoader(
        LoadConfig(load_format="staging", model_loader_extra_config={"threads": 0})
    )
    with pytest.raises(st.InvalidOptionError):
        bad.load_weights(Model(), ModelConfig(str(tmp_path / "model")))


def load_as_expert_rank_1_and_3(folder: Path) -> Tuple[Dict[str, Any], Any]:
    """The MoE checkpoint in `folder` loaded by vLLM's own loader and by staging's, as the
    expert-parallel rank holding experts 1 and 3: each load's tensors by format, and staging's
    loader (its `last_report`)."""
    from vllm import config as vllm_config
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader import get_model_loader

    import safetensors_staging.vllm as plugin

    config = ModelConfig(str(folder))
    config.is_moe = True

    class Moe(torch.nn.Module):
        def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> None:
            self.got = {name: tensor.clone() for name, tensor in weights}

    vllm_config.set_current_vllm_config(
        vllm_config.VllmConfig(
            parallel_config=vllm_config.ParallelConfig(
                enable_expert_parallel=True, local_expert_ids={1, 3}
            )
        )
    )
    try:
        got = {}
        plugin.register()
        for load_format in ("safetensors", "staging"):
            loader = get_model_loader(LoadConfig(load_format=load_format))
            model = Moe()
            loader.load_weights(model, config)
            got[load_format] = model.got
    finally:
        vllm_config.set_current_vllm_config(None)
    return got, loader


def test_expert_parallel_ranks_read_only_their_experts(vllm: Any, tmp_path: Path) -> None:
    """vLLM's expert-parallel filter: a rank's loader skips the other ranks' expert weights
    before reading them; with staging they are never read either."""
    import safetensors.torch

    (tmp_path / "moe").mkdir()
    experts = {
        f"mlp.experts.{e}.{kind}": torch.full((4, 4), float(e))
        for e in range(4)
        for kind in ("weight", "scale")
    }
    safetensors.torch.save_file(
        {**experts, "embed.weight": torch.ones(8, 4)}, tmp_path / "moe" / "model.safetensors"
    )
    got, loader = load_as_expert_rank_1_and_3(tmp_path / "moe")
    assert sorted(got["staging"]) == sorted(got["safetensors"])
    assert "mlp.experts.0.weight" not in got["staging"] and "mlp.experts.0.scale" in got["staging"]
    for name, tensor in got["staging"].items():
        assert torch.equal(tensor, got["safetensors"][name]), name
    skipped = sum(experts[f"mlp.experts.{e}.weight"].nbytes for e in (0, 2))
    total = sum(t.nbytes for t in experts.values()) + 8 * 4 * 4
    assert loader.last_report["bytes_read"] == total - skipped, "the skipped experts never read"


def test_an_expert_parallel_rank_reads_only_the_headers_of_its_shards(
    vllm: Any, tmp_path: Path
) -> None:
    """The same filter on a sharded checkpoint with an index: the rank's load goes through the
    index, so only the shards holding what it keeps have their headers read (issue 50)."""
    import json

    import safetensors.torch

    folder = tmp_path / "moe"
    folder.mkdir()
    weight_map = {}
    shards = {
        1: {"embed.weight": torch.ones(8, 4)},
        **{2 + e: {f"mlp.experts.{e}.weight": torch.full((4, 4), float(e))} for e in range(4)},
    }
    for number, tensors in shards.items():
        file = f"model-{number:05d}-of-00005.safetensors"
        safetensors.torch.save_file(tensors, folder / file)
        weight_map.update({name: file for name in tensors})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    got, loader = load_as_expert_rank_1_and_3(folder)
    assert (
        sorted(got["staging"])
        == sorted(got["safetensors"])
        == [
            "embed.weight",
            "mlp.experts.1.weight",
            "mlp.experts.3.weight",
        ]
    )
    for name, tensor in got["staging"].items():
        assert torch.equal(tensor, got["safetensors"][name]), name
    report = loader.last_report
    # The embedding's shard and the two experts' shards: three headers of five.
    assert (report["headers_read"], report["files"]) == (3, 3)
    assert report["bytes_read"] == 8 * 4 * 4 + 2 * 4 * 4 * 4


class TiedConfig(ModelConfig):
    """A model config whose `hf_config` says whether the word embeddings are tied, naming the
    stand-in `load_model`'s model class."""

    class HfConfig:
        def __init__(self, tie: bool) -> None:
            self.tie_word_embeddings = tie

        def get_text_config(self) -> Any:
            return self

    def __init__(self, model: str, tie: bool) -> None:
        super().__init__(model)
        self.hf_config = self.HfConfig(tie)
        self.model_class = TiedModel


class TiedModel(torch.nn.Module):
    """A language model's two ends: tied (`lm_head` is `embed`, and its weight is not loaded)
    when the config says so, as vLLM's models do."""

    def __init__(self, hf_config: Any) -> None:
        super().__init__()
        self.tied = hf_config.tie_word_embeddings
        self.embed = torch.nn.Embedding(8, 4)
        self.lm_head = self.embed if self.tied else torch.nn.Linear(4, 8, bias=False)

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> Set[str]:
        params = dict(self.named_parameters(remove_duplicate=False))
        loaded = set()
        for name, tensor in weights:
            if self.tied and name == "lm_head.weight":
                continue
            with torch.no_grad():
                params[name].copy_(tensor)
            loaded.add(name)
        return loaded


class Reader(torch.nn.Module):
    """A model with no parameters that reads every weight it is given."""

    def __init__(self, hf_config: Any = None) -> None:
        super().__init__()

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> Set[str]:
        return {name for name, _ in weights}


def test_tensors_go_to_vllms_load_device(
    vllm: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`load_config.device`, else `--device` (`device_config.device`); a device other than a GPU
    gets host tensors (vLLM's own loader gives host tensors for the model to copy)."""
    from vllm import config as vllm_config
    from vllm.config.load import LoadConfig

    import safetensors_staging._engines as engines
    import safetensors_staging.vllm as plugin

    assert engines.load_device("cuda:3") == "cuda:3"
    assert engines.load_device(torch.device("cuda", 1)) == "cuda:1"
    assert engines.load_device("xpu:0") == "cpu" and engines.load_device("cpu") == "cpu"

    checkpoint(tmp_path / "model")
    asked = record_devices(monkeypatch)
    config = TiedConfig(str(tmp_path / "model"), tie=False)
    config.model_class = Reader  # builds nothing on the (absent) GPU
    for load_device, device, expected in [
        ("cuda:3", "cpu", "cuda:3"),
        (None, "cuda:2", "cuda:2"),
        (None, "xpu", "cpu"),
    ]:
        vllm_cfg = vllm_config.VllmConfig(
            load_config=LoadConfig(load_format="staging", device=load_device),
            device_config=vllm_config.DeviceConfig(device=device),
        )
        loader = plugin.StagingModelLoader(vllm_cfg.load_config)
        with pytest.raises(StopAtDevice):
            loader.load_model(vllm_cfg, config)
        assert asked[-1] == expected, (load_device, device)
        # An in-place reload, outside load_model, asks the current vLLM config.
        vllm_config.set_current_vllm_config(vllm_cfg)
        try:
            with pytest.raises(StopAtDevice):
                list(loader.get_all_weights(config, Reader()))
        finally:
            vllm_config.set_current_vllm_config(None)
        assert asked[-1] == expected, (load_device, device)


def test_weights_elsewhere_untie_the_embeddings_as_vllm_does_for_a_model_directory(
    vllm: Any, tmp_path: Path
) -> None:
    """vLLM unties the word embeddings of a config that ties them when the checkpoint holds an
    `lm_head` (and re-ties them when the two are equal after loading); it looks in the model
    directory, so with `weights` elsewhere the plugin looks there instead."""
    import safetensors.torch
    from vllm import config as vllm_config
    from vllm.config.load import LoadConfig

    import safetensors_staging.vllm as plugin

    embed = torch.randn(8, 4)
    (tmp_path / "config-only").mkdir()
    for head, untied in [(embed.clone(), False), (torch.randn(8, 4), True)]:
        weights = tmp_path / f"weights-{untied}"
        weights.mkdir()
        safetensors.torch.save_file(
            {"embed.weight": embed, "lm_head.weight": head}, weights / "model.safetensors"
        )
        config = TiedConfig(str(tmp_path / "config-only"), tie=True)
        load_config = LoadConfig(
            load_format="staging", model_loader_extra_config={"weights": str(weights)}
        )
        vllm_cfg = vllm_config.VllmConfig(load_config=load_config)
        model = plugin.StagingModelLoader(load_config).load_model(vllm_cfg, config)
        assert config.word_embeddings_untied_by_checkpoint
        assert torch.equal(model.lm_head.weight, head), "the checkpoint's lm_head, not dropped"
        assert (model.lm_head.weight is model.embed.weight) is (not untied), "re-tied when equal"
    # A checkpoint without an lm_head leaves the config tied.
    no_head = tmp_path / "no-head"
    no_head.mkdir()
    safetensors.torch.save_file({"embed.weight": embed}, no_head / "model.safetensors")
    config = TiedConfig(str(tmp_path / "config-only"), tie=True)
    load_config = LoadConfig(
        load_format="staging", model_loader_extra_config={"weights": str(no_head)}
    )
    model = plugin.StagingModelLoader(load_config).load_model(
        vllm_config.VllmConfig(load_config=load_config), config
    )
    assert config.hf_config.tie_word_embeddings and model.lm_head is model.embed


def test_a_reload_from_another_path_reads_that_path_not_the_weights_given(
    vllm: Any, tmp_path: Path
) -> None:
    """vLLM's `reload_weights(weights_path=NEW)` makes a new loader from the same load config
    (so the same `weights`) and points the model config at NEW: the plugin reads NEW, as vLLM
    drops `model_weights` there ("they must not be carried over to the new path"). A reload
    without a new path reads the `weights` again."""
    import safetensors.torch
    from vllm import config as vllm_config
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader import get_model_loader

    import safetensors_staging.vllm as plugin

    plugin.register()
    embed = torch.randn(8, 4)
    first = tmp_path / "weights"
    first.mkdir()
    safetensors.torch.save_file({"embed.weight": embed}, first / "model.safetensors")
    (tmp_path / "config-only").mkdir()
    load_config = LoadConfig(
        load_format="staging",
        model_loader_extra_config={"weights": str(first), "backend": "host"},
    )
    config = TiedConfig(str(tmp_path / "config-only"), tie=True)
    model = plugin.StagingModelLoader(load_config).load_model(
        vllm_config.VllmConfig(load_config=load_config), config
    )
    assert torch.equal(model.embed.weight, embed)
    step = tmp_path / "step1"
    step.mkdir()
    safetensors.torch.save_file({"embed.weight": embed * 2}, step / "model.safetensors")
    # What reload_weights does: a new loader, the model config pointed at the new path.
    config.model, config.revision = str(step), None
    got = dict(get_model_loader(load_config).get_all_weights(config, model))
    assert torch.equal(got["embed.weight"], embed * 2), "the new checkpoint, not `weights`"
    config.model = str(tmp_path / "config-only")  # a reload from the model's own path
    got = dict(get_model_loader(load_config).get_all_weights(config, model))
    assert torch.equal(got["embed.weight"], embed), "the `weights` again"


def test_a_weights_url_is_refused_where_the_model_chooses_its_files(
    vllm: Any, tmp_path: Path
) -> None:
    """A model whose own weights are chosen by file patterns (or a subfolder) gets them from
    the `weights` directory, chosen by vLLM; a `weights` URL cannot apply the patterns, and is
    refused by name rather than read from the config directory."""
    from vllm.config.load import LoadConfig

    import safetensors_staging.vllm as plugin

    tensors = checkpoint(tmp_path / "weights")
    (tmp_path / "config-only").mkdir()
    config = ModelConfig(str(tmp_path / "config-only"))
    model = Model()
    model.allow_patterns_overrides = ["model-00002-*.safetensors"]
    local = plugin.StagingModelLoader(
        LoadConfig(
            load_format="staging", model_loader_extra_config={"weights": str(tmp_path / "weights")}
        )
    )
    got = dict(local.get_all_weights(config, model))
    assert sorted(got) == ["layer.bias", "layer.weight"]
    assert torch.equal(got["layer.weight"], tensors["layer.weight"])
    remote = plugin.StagingModelLoader(
        LoadConfig(
            load_format="staging",
            model_loader_extra_config={"weights": "s3://bucket/model"},
        )
    )
    with pytest.raises(ValueError, match="give `weights` as a local directory, not the URL"):
        list(remote.get_all_weights(config, model))


def test_a_streamed_model_skips_what_the_model_says_it_does_not_use(
    vllm: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Hub model streams with no file choice of vLLM's: the model's
    `is_unused_checkpoint_weight` picks the tensors (never read), as its `load_weights` would;
    with a ModelScope switch set, a model id is vLLM's to download, not `hf://`."""
    from vllm.config.load import LoadConfig

    import safetensors_staging._engines as engines
    import safetensors_staging.vllm as plugin

    tensors = checkpoint(tmp_path / "model")
    asked: List[Any] = []

    def stream(source: Any, device: str, options: Dict[str, Any], *rest: Any) -> Any:
        asked.append((source, options.get("select")))
        return engines_stream(str(tmp_path / "model"), device, options, *rest)

    engines_stream = engines.stream
    monkeypatch.setattr(engines, "stream", stream)
    model = Model()
    model.is_unused_checkpoint_weight = lambda name: name.startswith("embed")
    loader = plugin.StagingModelLoader(
        LoadConfig(load_format="staging", model_loader_extra_config={"backend": "host"})
    )
    got = dict(loader.get_all_weights(ModelConfig("org/tiny"), model))
    assert asked[0][0] == "hf://org/tiny@main"
    assert sorted(got) == ["layer.bias", "layer.weight"]
    assert loader.last_report["bytes_read"] == sum(
        tensors[n].nbytes for n in ("layer.bias", "layer.weight")
    ), "the unused embedding never read"
    monkeypatch.setenv("VLLM_USE_MODELSCOPE", "True")
    assert engines.hub_path("org/tiny") is None


def test_mm_encoder_only_reads_no_shard_of_the_language_model_alone(
    vllm: Any, tmp_path: Path
) -> None:
    """`--mm-encoder-only`: vLLM's shard filter drops the shards holding only the language
    model's tensors, before anything is read; `staging` reads what `safetensors` reads, and a
    filter that leaves nothing is vLLM's error."""
    from types import SimpleNamespace

    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader import get_model_loader

    import safetensors_staging.vllm as plugin

    plugin.register()
    tensors = checkpoint(tmp_path / "model")
    config = ModelConfig(str(tmp_path / "model"))
    config.multimodal_config = SimpleNamespace(mm_encoder_only=True)
    got = {}
    for load_format, extra in (("safetensors", {}), ("staging", {"backend": "host"})):
        loader = get_model_loader(
            LoadConfig(load_format=load_format, model_loader_extra_config=extra)
        )
        model = Model()
        model._language_model_names = ["embed"]  # the language model: shard 1 alone
        loader._init_mm_encoder_only_weight_filter(model, config)
        got[load_format] = dict(loader.get_all_weights(config, model))
    assert sorted(got["staging"]) == sorted(got["safetensors"]) == ["layer.bias", "layer.weight"]
    assert all(torch.equal(got["staging"][n], tensors[n]) for n in got["staging"])
    assert loader.last_report["bytes_read"] == sum(
        tensors[n].nbytes for n in ("layer.bias", "layer.weight")
    ), "the language model's shard never read"
    model._language_model_names = ["embed", "layer"]
    loader._init_mm_encoder_only_weight_filter(model, config)
    with pytest.raises(RuntimeError, match="mm-encoder-only shard filter removed all weight files"):
        list(loader.get_all_weights(config, model))


def test_a_torchao_checkpoint_is_refused_by_name(vllm: Any, tmp_path: Path) -> None:
    """vLLM's `load_weights` switches its reader to `torchao` for a torchao-serialized
    checkpoint (its iterator rebuilds the tensor subclasses): the plugin refuses rather than
    hand out plain tensors."""
    from vllm.config.load import LoadConfig

    import safetensors_staging.vllm as plugin

    checkpoint(tmp_path / "model")
    loader = plugin.StagingModelLoader(LoadConfig(load_format="staging"))
    loader.load_config.safetensors_load_strategy = "torchao"
    with pytest.raises(ValueError, match="torchao-serialized.*--load-format safetensors"):
        list(loader.get_all_weights(ModelConfig(str(tmp_path / "model")), Model()))


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


# The vLLM symbols the plugin uses, with the parameters it passes (`*name`: by keyword).
_LOADER = "vllm.model_executor.model_loader.default_loader"
USED = [
    ("vllm.model_executor.model_loader", "register_model_loader", ["load_format"]),
    ("vllm.model_executor.model_loader", "get_model_loader", ["load_config"]),
    (_LOADER, "DefaultModelLoader.__init__", ["self", "load_config"]),
    (
        _LOADER,
        "DefaultModelLoader._prepare_weights",
        [
            "self",
            "model_name_or_path",
            "subfolder",
            "revision",
            "fall_back_to_pt",
            "allow_patterns_overrides",
        ],
    ),
    (
        _LOADER,
        "DefaultModelLoader.Source",
        [
            "model_or_path",
            "revision",
            "subfolder",
            "prefix",
            "fall_back_to_pt",
            "allow_patterns_overrides",
            "is_unused_weight",
        ],
    ),
    (
        "vllm.model_executor.model_loader.base_loader",
        "BaseModelLoader.load_model",
        ["self", "vllm_config", "model_config", "prefix"],
    ),
    (
        "vllm.model_executor.model_loader.weight_utils",
        "filter_mm_encoder_only_safetensors_files",
        [
            "hf_weights_files",
            "hf_folder",
            "index_file",
            "language_model_prefixes",
            "*weights_mapper",
        ],
    ),
    (
        "vllm.model_executor.model_loader.weight_utils",
        "filter_safetensors_files_by_weight_name",
        ["hf_weights_files", "is_unused_weight"],
    ),
    (
        "vllm.model_executor.model_loader.ep_weight_filter",
        "should_skip_weight",
        ["weight_name", "local_expert_ids"],
    ),
    ("vllm.config", "get_current_vllm_config_or_none", []),
    ("vllm.distributed.parallel_state", "get_world_group", []),
]
# What vLLM calls on the plugin's loader that it overrides, checked against vLLM's own
# `DefaultModelLoader`.
OVERRIDDEN = (
    _LOADER,
    "DefaultModelLoader",
    [
        "__init__",
        "_prepare_weights",
        "_get_weights_iterator",
        "get_all_weights",
        "download_model",
        "load_model",
    ],
)
# What the plugin reads of the state vLLM's `DefaultModelLoader.__init__` sets.
STATE = [
    "local_expert_ids",
    "_encoder_only_lm_prefixes",
    "_encoder_only_weights_mapper",
    "counter_before_loading_weights",
    "enable_weights_track",
]


def _signatures() -> Dict[str, Any]:
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    out = signatures(
        USED,
        LoadConfig,
        {
            "load_format",
            "download_dir",
            "model_loader_extra_config",
            "ignore_patterns",
            "device",
        },
        OVERRIDDEN,
    )
    loader = DefaultModelLoader(LoadConfig(load_format="safetensors"))
    out["state"] = [name for name in STATE if hasattr(loader, name)]
    return out


def test_standins_use_what_the_plugin_passes_and_take_what_vllm_passes(vllm: Any) -> None:
    got = _signatures()
    check_signatures(got, USED)
    assert got["LoadConfig"] == [
        "device",
        "download_dir",
        "ignore_patterns",
        "load_format",
        "model_loader_extra_config",
    ]
    assert got["state"] == STATE
    # The check can fail: an override that drops a parameter the engine passes.
    assert not overrides_take(
        [["self", "POSITIONAL_OR_KEYWORD"], ["source", "POSITIONAL_OR_KEYWORD"]],
        [["self", "POSITIONAL_OR_KEYWORD"]],
    )
    assert not overrides_take(
        [["self", "POSITIONAL_OR_KEYWORD"], ["resolved_source", "KEYWORD_ONLY"]],
        [["self", "POSITIONAL_OR_KEYWORD"], ["source", "POSITIONAL_OR_KEYWORD"]],
    )


@pytest.mark.skipif(
    not real_importable("vllm"),
    reason="the real vLLM is not installed here (scripts/check-vllm.sh installs it)",
)
def test_standins_have_the_real_signatures() -> None:
    compare_with_real("test_engines_vllm", USED)
    code = (
        f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
        "from test_engines_vllm import _signatures; print(json.dumps(_signatures()['state']))"
    )
    real = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert json.loads(real.stdout.strip().splitlines()[-1]) == STATE, real.stderr[-2000:]


def test_a_hub_model_s_weights_are_read_at_the_commit_of_its_config(
    vllm: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the engine's config says which commit it was read at (`transformers`' record of
    it, `_commit_hash`), the weights are read at that commit, not at whatever the revision
    names by the time they are: config and weights of one commit."""
    from vllm.config.load import LoadConfig

    import safetensors_staging._engines as engines
    import safetensors_staging.vllm as plugin

    checkpoint(tmp_path / "model")
    asked: List[Any] = []

    def stream(source: Any, device: str, options: Dict[str, Any], *rest: Any) -> Any:
        asked.append(source)
        return engines_stream(str(tmp_path / "model"), device, options, *rest)

    engines_stream = engines.stream
    monkeypatch.setattr(engines, "stream", stream)
    loader = plugin.StagingModelLoader(
        LoadConfig(load_format="staging", model_loader_extra_config={"backend": "host"})
    )
    config = ModelConfig("org/tiny")
    commit = "0123456789abcdef0123456789abcdef01234567"
    config.hf_config = type("HfConfig", (), {"_commit_hash": commit})()
    loader.download_model(config)
    dict(loader.get_all_weights(config, Model()))
    assert asked == [f"hf://org/tiny@{commit}"]
    # Without a recorded commit, the revision asked for.
    other = plugin.StagingModelLoader(
        LoadConfig(load_format="staging", model_loader_extra_config={"backend": "host"})
    )
    dict(other.get_all_weights(ModelConfig("org/tiny"), Model()))
    assert asked[-1] == "hf://org/tiny@main"


def deepseek_shaped(folder: Path) -> Dict[str, bytes]:
    """A checkpoint with DeepSeek-V3's tensor names and count (61 layers, the first 3 dense,
    256 routed experts and a shared one, MLA attention, FP8 weights with an F32 scale each:
    90,427 tensors) in 163 shards with an index, every tensor tiny ([8, 16] FP8 weights, a
    [1, 1] scale, [16] norms) and its bytes random; returns the bytes by name."""
    import random

    rng = random.Random(50)
    specs: List[Tuple[str, str, List[int]]] = [("model.embed_tokens.weight", "BF16", [32, 16])]

    def fp8(name: str) -> None:
        specs.append((f"{name}.weight", "F8_E4M3", [8, 16]))
        specs.append((f"{name}.weight_scale_inv", "F32", [1, 1]))

    for layer in range(61):
        p = f"model.layers.{layer}"
        for norm in ("input_layernorm", "post_attention_layernorm"):
            specs.append((f"{p}.{norm}.weight", "BF16", [16]))
        for proj in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"):
            fp8(f"{p}.self_attn.{proj}")
        for norm in ("q_a_layernorm", "kv_a_layernorm"):
            specs.append((f"{p}.self_attn.{norm}.weight", "BF16", [16]))
        mlps = [f"{p}.mlp"] if layer < 3 else [f"{p}.mlp.experts.{e}" for e in range(256)]
        if layer >= 3:
            mlps.append(f"{p}.mlp.shared_experts")
            specs.append((f"{p}.mlp.gate.weight", "BF16", [256, 16]))
            specs.append((f"{p}.mlp.gate.e_score_correction_bias", "F32", [256]))
        for mlp in mlps:
            for proj in ("gate_proj", "up_proj", "down_proj"):
                fp8(f"{mlp}.{proj}")
    specs.append(("model.norm.weight", "BF16", [16]))
    specs.append(("lm_head.weight", "BF16", [32, 16]))
    size = {"F8_E4M3": 1, "BF16": 2, "F32": 4}
    per = -(-len(specs) // 163)
    contents: Dict[str, bytes] = {}
    weight_map: Dict[str, str] = {}
    for s in range(163):
        group = specs[s * per : (s + 1) * per]
        file = f"model-{s + 1:05d}-of-000163.safetensors"
        header: Dict[str, Any] = {"__metadata__": {"format": "pt"}}
        data = bytearray()
        for name, dtype, shape in group:
            n = size[dtype]
            for d in shape:
                n *= d
            contents[name] = rng.randbytes(n)
            header[name] = {
                "dtype": dtype,
                "shape": shape,
                "data_offsets": [len(data), len(data) + n],
            }
            data += contents[name]
            weight_map[name] = file
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        (folder / file).write_bytes(len(text).to_bytes(8, "little") + text + bytes(data))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return contents


def test_ranks_of_a_deepseek_shaped_checkpoint_read_only_their_bytes_and_headers(
    vllm: Any, tmp_path: Path
) -> None:
    """At DeepSeek-V3's width (90,427 tensors, 163 shards; issue 50): vLLM's expert-parallel
    rank holding experts 1 and 3 reads, through the plugin, exactly the bytes of the tensors
    vLLM's filter keeps (the same tensors as vLLM's own loader), and only the headers of the
    shards holding them; a tensor-parallel rank's rows of one layer's attention read those
    rows alone, from the headers of that layer's shards only."""
    import fnmatch

    from vllm.model_executor.model_loader.ep_weight_filter import should_skip_weight

    import safetensors_staging as st

    folder = tmp_path / "deepseek"
    folder.mkdir()
    contents = deepseek_shaped(folder)
    weight_map = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(contents) == 90_427 and len(set(weight_map.values())) == 163

    def as_bytes(tensor: torch.Tensor) -> bytes:
        return tensor.contiguous().view(torch.uint8).numpy().tobytes()

    got, loader = load_as_expert_rank_1_and_3(folder)
    kept = {name for name in contents if not should_skip_weight(name, {1, 3})}
    assert got["staging"].keys() == got["safetensors"].keys() == kept
    assert len(kept) == len(contents) - 58 * 254 * 3  # 254 other experts' 3 weights a layer
    for name in kept:
        assert as_bytes(got["staging"][name]) == contents[name], name
    report = loader.last_report
    assert report["tensors"] == len(kept)
    assert report["bytes_read"] == sum(len(contents[name]) for name in kept)
    assert report["headers_read"] == len({weight_map[name] for name in kept})

    # A tensor-parallel rank (part 1 of 4) of layer 10's attention projections.
    select = ["model.layers.10.self_attn.*"]
    rows = {"model.layers.10.self_attn.*_proj.weight": "1/4"}
    with st.stage(folder, select=select, rows=rows) as it:
        part = {name: as_bytes(tensor) for name, tensor in it}
        report = it.report()
    chosen = [n for n in contents if fnmatch.fnmatchcase(n, select[0])]
    want = {}
    for name in chosen:
        # Rows 2..4 of 8 rows of 16 FP8 bytes where the rows rule applies; whole otherwise.
        split = fnmatch.fnmatchcase(name, next(iter(rows)))
        want[name] = contents[name][2 * 16 : 4 * 16] if split else contents[name]
    assert part == want
    assert report["bytes_read"] == sum(map(len, want.values()))
    assert report["headers_read"] == len({weight_map[n] for n in chosen}) <= 2
