"""SGLang's own load path, as a server's ModelRunner takes it, on a CPU: `--load-format
safetensors` and `--load-format staging` (the plugin) each build SGLang's model from the same
checkpoint through `build_load_config`, `get_model_loader` and `load_model`; every parameter of
the two models is compared, byte for byte."""

import json
import os
import sys
import tempfile
import types
from pathlib import Path
from types import SimpleNamespace

import torch

# SGLang's rotary embedding, on a machine without a GPU, imports vLLM's kernel for the forward
# pass; nothing here runs a forward pass, so a module without that kernel stands in.
for name in ("vllm", "vllm._custom_ops"):
    sys.modules[name] = types.ModuleType(name)
sys.modules["vllm._custom_ops"].rotary_embedding = None
# After the stand-in above, as before: SGLang's modules below are to find it.
import sglang.srt.distributed.parallel_state as parallel_state  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from sglang.srt.configs.device_config import DeviceConfig  # noqa: E402
from sglang.srt.configs.load_config import LoadConfig  # noqa: E402
from sglang.srt.configs.model_config import ModelConfig  # noqa: E402
from sglang.srt.model_executor.model_runner_components.load_model_utils import build_load_config  # noqa: E402
from sglang.srt.model_loader.loader import get_model_loader  # noqa: E402
from sglang.srt.plugins import load_plugins  # noqa: E402
from sglang.srt.runtime_context import SpawnRanks, publish  # noqa: E402
from sglang.srt.server_args import prepare_server_args  # noqa: E402
from sglang.srt.utils.model_file_verifier import IntegrityError, generate_checksums  # noqa: E402
from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from safetensors_staging.sglang import StagingModelLoader  # noqa: E402

load_plugins()
root = Path(tempfile.mkdtemp())


def qwen2(name, tied, shard="40KB", seed=3):
    torch.manual_seed(seed)
    Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=tied,
        )
    ).save_pretrained(root / name, max_shard_size=shard)
    return root / name


def sglang_load(path, *flags, quantization=None, load=True):
    """SGLang's loader for these flags, and the model it loads (with a quantization, or
    `load=False`: the model config instead, nothing loaded)."""
    args = prepare_server_args(["--model-path", str(path), "--device", "cpu", *flags])
    args.resolve_once()
    publish(args, role="test", ranks=SpawnRanks(world_rank=0))
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            backend="gloo",
            distributed_init_method="tcp://127.0.0.1:29517",
        )
        parallel_state.initialize_model_parallel()
    model_config = ModelConfig.from_server_args(args)
    if quantization is not None:
        model_config.quantization = quantization
    load_config = build_load_config(
        server_args=args,
        tp_rank=0,
        remote_instance_weight_transporter_engine=None,
        remote_instance_weight_transporter_session_id="",
        draft_model_idx=None,
        weight_cache_mode="off",
        weight_cache_socket=None,
    )
    loader = get_model_loader(load_config, model_config)
    if quantization is not None or not load:
        return loader, model_config
    configs[loader] = model_config
    return loader, loader.load_model(model_config=model_config, device_config=DeviceConfig("cpu"))


configs = {}

STAGING = ("--load-format", "staging", "--model-loader-extra-config", '{"backend": "host"}')


def compare(path, what, *flags, missing=(), ours_path=None, extra=None):
    theirs_loader, theirs = sglang_load(path, "--load-format", "safetensors", *flags)
    staging = (
        STAGING
        if extra is None
        else (
            "--load-format",
            "staging",
            "--model-loader-extra-config",
            json.dumps({"backend": "host", **extra}),
        )
    )
    ours_loader, ours = sglang_load(ours_path or path, *staging, *flags)
    assert type(ours_loader) is StagingModelLoader, type(ours_loader)
    a, b = theirs.state_dict(), ours.state_dict()
    assert a.keys() == b.keys(), a.keys() ^ b.keys()
    compared = [n for n in a if not any(n.startswith(m) for m in missing)]
    for name in compared:
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name
    # Not two equal random inits: the parameters SGLang keeps unfused are the checkpoint's tensors.
    saved = {k: v for f in sorted(path.glob("*.safetensors")) for k, v in load_file(f).items()}
    unfused = sorted(set(saved) & set(b))
    assert len(unfused) >= 5 and all(torch.equal(b[k], saved[k].to(b[k].dtype)) for k in unfused), (
        unfused
    )
    devices = sorted({str(p.device) for p in ours.parameters()})
    report = ours_loader.last_report
    print(
        f"load_model, {what}: {type(ours).__qualname__}, --load-format safetensors"
        f" ({type(theirs_loader).__qualname__}) and staging ({type(ours_loader).__qualname__}) give the"
        f" same {len(compared)} state-dict tensors{' (but ' + ', '.join(missing) + ')' if missing else ''},"
        f" bytes equal ({len(unfused)} unfused ones equal to the checkpoint's, as {b[unfused[0]].dtype});"
        f" staging read {report['tensors']} tensors, {report['bytes_read']} bytes, onto {devices}"
    )


sharded = qwen2("qwen2", tied=False)
compare(sharded, f"Qwen2 in {len(list(sharded.glob('*.safetensors')))} shards with an index")
compare(qwen2("qwen2-tied", tied=True, shard="10GB"), "Qwen2 with tied embeddings, one file")
# The weight sources an SGLang model can name, through SGLang's own `_get_all_weights`:
# `safetensors` and `staging` give the same names and bytes for each.
from sglang.srt.model_loader.loader import DefaultModelLoader  # noqa: E402 (after load_plugins(), as before)

extra_dir = root / "vision"
extra_dir.mkdir()
save_file({"proj.weight": torch.arange(6.0).reshape(2, 3)}, extra_dir / "v.safetensors")
sources = {
    "the model's own": {},
    "allow_patterns_overrides": {"allow_patterns_overrides": ["model-0000[1-3]-of-*.safetensors"]},
    "secondary_weights (another directory, a prefix)": {
        "secondary_weights": [DefaultModelLoader.Source(str(extra_dir), None, prefix="v.")]
    },
}
for what, attributes in sources.items():
    got = {}
    for flags in (("--load-format", "safetensors"), STAGING):
        args = prepare_server_args(["--model-path", str(sharded), "--device", "cpu", *flags])
        args.resolve_once()
        publish(args, role="test", ranks=SpawnRanks(world_rank=0))
        model_config = ModelConfig.from_server_args(args)
        load_config = build_load_config(
            server_args=args,
            tp_rank=0,
            remote_instance_weight_transporter_engine=None,
            remote_instance_weight_transporter_session_id="",
            draft_model_idx=None,
            weight_cache_mode="off",
            weight_cache_socket=None,
        )
        loader = get_model_loader(load_config, model_config)
        got[flags[1]] = [
            (n, t.clone())
            for n, t in loader._get_all_weights(model_config, SimpleNamespace(**attributes))
        ]
    theirs, ours = dict(got["safetensors"]), dict(got["staging"])
    assert sorted(theirs) == sorted(ours) and len(ours) == len(got["staging"]), (
        what,
        sorted(theirs),
        sorted(ours),
    )
    assert all(torch.equal(theirs[n], ours[n]) for n in theirs), what
    print(
        f"_get_all_weights, {what}: safetensors and staging give the same {len(ours)} tensors, bytes equal"
    )
# SGLANG_SORT_WEIGHT_FILES: the files are read in the order SGLang's own file choice gives.
import safetensors_staging._engines as engines  # noqa: E402 (where it was)

read = []
stream = engines.stream
engines.stream = lambda source, *rest: read.append(list(source)) or stream(source, *rest)
for order in ("0", "-1"):
    os.environ["SGLANG_SORT_WEIGHT_FILES"] = order
    loader, model_config = sglang_load(sharded, *STAGING, load=False)
    theirs = DefaultModelLoader(LoadConfig(load_format="safetensors"))._prepare_weights(
        str(sharded), None, True
    )[1]
    list(loader._get_all_weights(model_config, SimpleNamespace()))
    assert read[-1] == theirs, (order, read[-1], theirs)
    print(
        f"SGLANG_SORT_WEIGHT_FILES={order}: staging reads the {len(theirs)} files in SGLang's own order",
        f"({'sorted' if theirs == sorted(theirs) else 'as globbed, not sorted'})",
    )
del os.environ["SGLANG_SORT_WEIGHT_FILES"]
engines.stream = stream
# `weights` elsewhere: the config in one directory, the weights in another.
(root / "config-only").mkdir()
for f in sharded.glob("config*.json"):
    (root / "config-only" / f.name).write_bytes(f.read_bytes())
compare(
    sharded,
    "config and weights in two directories (extra config `weights`)",
    ours_path=root / "config-only",
    extra={"weights": str(sharded)},
)
# SGLang's own update_weights_from_disk of that server (started with `weights` elsewhere) from a
# new checkpoint: the new path is read, in place, not the server's `weights`.
from sglang.srt.model_executor.model_runner_components.weight_updater import WeightUpdater  # noqa: E402

step = qwen2("qwen2-step", tied=False, seed=4)
_, want = sglang_load(step, "--load-format", "safetensors")
server_loader, model = sglang_load(
    root / "config-only",
    "--load-format",
    "staging",
    "--model-loader-extra-config",
    json.dumps({"backend": "host", "weights": str(sharded)}),
)
memory = {name: p.data_ptr() for name, p in model.named_parameters()}
updater = WeightUpdater(
    tp_rank=0,
    device="cpu",
    gpu_id=0,
    model_config=configs[server_loader],
    custom_weight_loaders={},
    get_model=lambda: model,
    update_model_fields=lambda *a, **k: None,
    recapture_cuda_graph=lambda: None,
    get_model_runner=lambda: None,
)
ok, message = updater.update_weights_from_disk(str(step), "staging")
assert ok, message
a, b = want.state_dict(), model.state_dict()
for name, p in model.named_parameters():
    assert torch.equal(p, a[name]) and p.data_ptr() == memory[name], name
print(
    f"update_weights_from_disk(a new checkpoint, 'staging') of a server started with `weights` elsewhere:"
    f" {message} all {len(memory)} parameters in place, equal to a fresh safetensors load of the new path"
)
# --model-checksum: SGLang verifies the files before either format reads them.
generate_checksums(source=str(sharded), output_path=str(root / "sums.json"))
compare(
    sharded,
    "--model-checksum (the checksums SGLang generated)",
    "--model-checksum",
    str(root / "sums.json"),
)
first = sorted(sharded.glob("model-*.safetensors"))[0]
data = bytearray(first.read_bytes())
data[-1] ^= 1
first.write_bytes(bytes(data))
for flags in (("--load-format", "safetensors"), STAGING):
    try:
        sglang_load(sharded, *flags, "--model-checksum", str(root / "sums.json"))
    except IntegrityError as e:
        print(
            f"--model-checksum, one byte of {first.name} changed, {flags[1]}: SGLang's IntegrityError:",
            str(e)[:90],
            "...",
        )
    else:
        raise AssertionError(f"{flags[1]} loaded a changed file despite --model-checksum")
data[-1] ^= 1
first.write_bytes(bytes(data))
# SGLang checks no missing weights: a checkpoint without one loads under both formats alike.
gap = qwen2("qwen2-gap", tied=True, shard="10GB")
tensors = load_file(gap / "model.safetensors")
del tensors["model.layers.0.mlp.down_proj.weight"]
save_file(tensors, gap / "model.safetensors", metadata={"format": "pt"})
compare(
    gap,
    "a checkpoint without model.layers.0.mlp.down_proj.weight",
    missing=("model.layers.0.mlp.down_proj.weight",),
)
# A quantization SGLang loads with a loader of its own: SGLang picks it for `safetensors`; the
# class as load format would bypass that choice, so it refuses by name before reading anything.
theirs, _ = sglang_load(sharded, "--load-format", "safetensors", quantization="auto-round-int8")
ours, model_config = sglang_load(sharded, *STAGING, quantization="auto-round-int8")
try:
    ours.load_model(model_config=model_config, device_config=DeviceConfig("cpu"))
except ValueError as e:
    print(
        f"quantization auto-round-int8: SGLang's get_model_loader gives {type(theirs).__qualname__} for"
        f" safetensors; staging refuses: {e}"
    )
else:
    raise AssertionError("staging loaded an auto-round-int8 model as plain weights")
