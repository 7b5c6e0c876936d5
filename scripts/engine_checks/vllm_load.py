"""vLLM's own load path on a CPU: `--load-format safetensors` and `--load-format staging` (the
plugin), each through vLLM's own argument parser and `create_engine_config`, then
`get_model_loader` and `load_model`, build vLLM's model from the same checkpoint; every
parameter of the two models is compared, byte for byte. vLLM 0.34 refuses x86 CPUs without
triton-cpu (its CPU attention kernels): that platform check is told Triton is there, since
nothing here runs a forward pass."""

import json
import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch
import vllm.triton_utils

vllm.triton_utils.HAS_TRITON = True
# After HAS_TRITON is set (above), as before: the vLLM modules below see it.
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402
from vllm.config import set_current_vllm_config  # noqa: E402
from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment  # noqa: E402
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.model_executor.model_loader import get_model_loader  # noqa: E402
from vllm.model_executor.model_loader.reload.inplace import reload_weights  # noqa: E402
from vllm.plugins import load_general_plugins  # noqa: E402
from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: E402

import safetensors_staging.vllm as plugin  # noqa: E402

load_general_plugins()
root = Path(tempfile.mkdtemp())


def qwen2(name, tied, seed=3, shard="40KB"):
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


def engine_config(path, *flags):
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    args = parser.parse_args(["--model", str(path), "--enforce-eager", *flags])
    return EngineArgs.from_cli_args(args).create_engine_config()


initialized = False


def vllm_load(path, *flags):
    global initialized
    config = engine_config(path, *flags)
    with set_current_vllm_config(config):
        if not initialized:
            init_distributed_environment(
                world_size=1,
                rank=0,
                local_rank=0,
                backend="gloo",
                distributed_init_method="tcp://127.0.0.1:29533",
            )
            ensure_model_parallel_initialized(1, 1)
            initialized = True
        loader = get_model_loader(config.load_config)
        return (
            config,
            loader,
            loader.load_model(vllm_config=config, model_config=config.model_config),
        )


def staging(extra=None):
    return (
        "--load-format",
        "staging",
        "--model-loader-extra-config",
        json.dumps({"backend": "host", **(extra or {})}),
    )


def compare(what, theirs_path, ours_path=None, extra=None):
    _, theirs_loader, theirs = vllm_load(theirs_path, "--load-format", "safetensors")
    config, ours_loader, ours = vllm_load(ours_path or theirs_path, *staging(extra))
    assert (
        config.load_config.load_format == "staging"
        and type(ours_loader) is plugin.StagingModelLoader
    )
    a, b = theirs.state_dict(), ours.state_dict()
    assert a.keys() == b.keys(), a.keys() ^ b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name
    # Not two equal random inits: the parameters vLLM keeps unfused are the checkpoint's tensors.
    saved = {
        k: v for f in sorted(theirs_path.glob("*.safetensors")) for k, v in load_file(f).items()
    }
    unfused = sorted(set(saved) & {f"model.{k}" for k in b} | set(saved) & set(b))

    def param(k):
        return b[k] if k in b else b[k.removeprefix("model.")]

    assert len(unfused) >= 5 and all(
        torch.equal(param(k), saved[k].to(param(k).dtype)) for k in unfused
    ), unfused
    report = ours_loader.last_report
    print(
        f"load_model, {what}: {type(ours).__qualname__}, --load-format safetensors"
        f" ({type(theirs_loader).__qualname__}) and staging (parsed by vLLM: {type(ours_loader).__qualname__})"
        f" give the same {len(a)} state-dict tensors, bytes equal ({len(unfused)} unfused ones equal to the"
        f" checkpoint's, as {param(unfused[0]).dtype}); staging read {report['tensors']} tensors,"
        f" {report['bytes_read']} bytes, onto {sorted({str(p.device) for p in ours.parameters()})}"
    )
    return config, ours


sharded = qwen2("qwen2", tied=False)
config, model = compare(
    f"Qwen2 in {len(list(sharded.glob('*.safetensors')))} shards with an index", sharded
)
tied = qwen2("qwen2-tied", tied=True, shard="10GB")
compare("Qwen2 with tied embeddings, one file", tied)
# The config in one directory, the weights in another (`weights`), for a config that ties the
# embeddings and a checkpoint that holds an lm_head of its own: vLLM unties them when it finds
# the lm_head in the model directory; the plugin looks in `weights`.
headed = qwen2("qwen2-tied-head", tied=True, shard="10GB")
tensors = load_file(headed / "model.safetensors")
tensors["lm_head.weight"] = torch.randn_like(tensors["model.embed_tokens.weight"])
save_file(tensors, headed / "model.safetensors", metadata={"format": "pt"})
(root / "config-only").mkdir()
for f in headed.glob("*.json"):
    (root / "config-only" / f.name).write_bytes(f.read_bytes())
apart_config, apart = compare(
    "a tied config, a checkpoint with its own lm_head, config and weights in two"
    " directories (extra config `weights`)",
    headed,
    root / "config-only",
    {"weights": str(headed)},
)
assert torch.equal(
    apart.lm_head.weight, tensors["lm_head.weight"].to(apart.lm_head.weight.dtype)
), "untied"

# The weight sources a vLLM model can name, through vLLM's own `get_all_weights` (the load's and
# the reload's): `safetensors` and `staging` give the same names and bytes for each.
from vllm.config.load import LoadConfig  # noqa: E402 (where it was, after the loads above)
from vllm.model_executor.model_loader.default_loader import DefaultModelLoader  # noqa: E402

extra_dir = root / "vision"
extra_dir.mkdir()
save_file({"proj.weight": torch.arange(6.0).reshape(2, 3)}, extra_dir / "v.safetensors")
(sharded / "sub").mkdir()
save_file({"head.weight": torch.full((4,), 7.0)}, sharded / "sub" / "s.safetensors")
sources = {
    "the model's own": {},
    "allow_patterns_overrides": {"allow_patterns_overrides": ["model-0000[1-3]-of-*.safetensors"]},
    "is_unused_checkpoint_weight": {"is_unused_checkpoint_weight": lambda n: ".layers.1." in n},
    "secondary_weights (another directory, a prefix)": {
        "secondary_weights": [DefaultModelLoader.Source(str(extra_dir), None, prefix="v.")]
    },
    "secondary_weights (a subfolder)": {
        "secondary_weights": [
            DefaultModelLoader.Source(str(sharded), None, subfolder="sub", prefix="s.")
        ]
    },
}
model_config = engine_config(sharded, "--load-format", "safetensors").model_config
for what, attributes in sources.items():
    got = {}
    for load_format, extra in (("safetensors", {}), ("staging", {"backend": "host"})):
        loader = get_model_loader(
            LoadConfig(load_format=load_format, model_loader_extra_config=extra)
        )
        got[load_format] = [
            (n, t.clone())
            for n, t in loader.get_all_weights(model_config, SimpleNamespace(**attributes))
        ]
    theirs, ours = dict(got["safetensors"]), dict(got["staging"])
    assert sorted(theirs) == sorted(ours) and len(ours) == len(got["staging"]), (
        what,
        sorted(theirs),
        sorted(ours),
    )
    assert all(torch.equal(theirs[n], ours[n]) for n in theirs), what
    print(
        f"get_all_weights, {what}: safetensors and staging give the same {len(ours)} tensors, bytes equal"
    )


# A checkpoint lacking a weight: the same outcome under both formats, with vLLM's check for
# weights not loaded (`enable_weights_track`) off, as it is by default here, and on.
def outcome(path, *flags):
    try:
        vllm_load(path, *flags)
        return "loaded"
    except Exception as e:  # noqa: BLE001 (the outcome is the point)
        return f"{type(e).__name__}: {e}"


# model.layers.0.mlp.down_proj.weight is exempt (its layer post-processes its weights);
# model.norm.weight is not.
for lacking in ("model.layers.0.mlp.down_proj.weight", "model.norm.weight"):
    gap = qwen2(f"lacking-{lacking}", tied=True, shard="10GB")
    tensors = load_file(gap / "model.safetensors")
    del tensors[lacking]
    save_file(tensors, gap / "model.safetensors", metadata={"format": "pt"})
    for track in (None, True):
        extra = {} if track is None else {"enable_weights_track": track}
        theirs = outcome(
            gap, "--load-format", "safetensors", "--model-loader-extra-config", json.dumps(extra)
        )
        ours = outcome(gap, *staging(extra))
        assert theirs == ours, (lacking, track, theirs, ours)
        print(
            f"a checkpoint lacking {lacking}, extra config {extra}: safetensors and staging"
            f" alike: {ours[:150]}"
        )

# vLLM's own in-place reload (`collective_rpc("reload_weights")` in each worker) of the models
# loaded with `staging`: the new checkpoint read through the library into the same memory. The
# one loaded with `weights` elsewhere reads the new path too, not those `weights`.
step = qwen2("qwen2-step", tied=False, seed=4)
_, _, want = vllm_load(step, "--load-format", "safetensors")
for what, (loaded_config, loaded) in [
    ("that Qwen2", (config, model)),
    ("the one with `weights` elsewhere", (apart_config, apart)),
]:
    memory = {name: p.data_ptr() for name, p in loaded.named_parameters()}
    with set_current_vllm_config(loaded_config):
        reload_weights(loaded_config, loaded, None, str(step), True)
    for name, p in loaded.named_parameters():
        assert torch.equal(p, want.state_dict()[name]) and p.data_ptr() == memory[name], name
    print(
        f"reload_weights(load format staging) of {what} from another checkpoint: all"
        f" {len(memory)} parameters in place (the same memory), equal to a fresh safetensors load"
    )
