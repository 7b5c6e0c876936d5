"""The plugin as `sglang serve` meets it: `load_plugins()` (our entry point), SGLang's own argument
parsing and checks, the published server arguments, then SGLang's LoadConfig and get_model_loader."""

import tempfile
from importlib.metadata import entry_points
from pathlib import Path

import safetensors.torch
import sglang
import torch
from sglang.srt.configs.load_config import LoadConfig
from sglang.srt.model_loader.loader import DefaultModelLoader, get_model_loader
from sglang.srt.plugins import load_plugins
from sglang.srt.runtime_context import SpawnRanks, publish
from sglang.srt.server_args import prepare_server_args

from safetensors_staging.sglang import StagingModelLoader

print("sglang", sglang.__version__, "torch", torch.__version__)
print(
    "sglang.srt.plugins entry points:",
    [f"{e.name} = {e.value}" for e in entry_points(group="sglang.srt.plugins")],
)
load_plugins()
g = torch.Generator().manual_seed(1)
want = {
    "embed.weight": torch.randn(64, 16, generator=g),
    "proj.weight": torch.randn(8, 16, generator=g),
}
d = Path(tempfile.mkdtemp())
safetensors.torch.save_file(want, d / "model.safetensors")
from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402 (after load_plugins(), as before)

Qwen2ForCausalLM(
    Qwen2Config(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
).save_pretrained(d / "qwen2")
args = prepare_server_args(
    [
        "--model-path",
        str(d / "qwen2"),
        "--device",
        "cpu",
        "--load-format",
        "staging",
        "--model-loader-extra-config",
        '{"backend": "host"}',
    ]
)
args.resolve_once()  # what `sglang serve` does next: SGLang's own checks of the arguments
print(
    "prepare_server_args(--load-format staging) + resolve_once: load_format =",
    repr(args.load_format),
)
publish(args, role="test", ranks=SpawnRanks(world_rank=0))  # what each SGLang process does
config = LoadConfig(
    load_format=args.load_format, model_loader_extra_config=args.model_loader_extra_config
)
assert config.load_format is StagingModelLoader, config.load_format
loader = get_model_loader(config)
assert type(loader) is StagingModelLoader, type(loader)
got = dict(loader._get_weights_iterator(DefaultModelLoader.Source(str(d), None, prefix="")))
assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
print(
    "LoadConfig(load_format='staging') ->",
    type(loader).__module__ + "." + type(loader).__qualname__,
    "; its weights over SGLang's DefaultModelLoader.Source: bytes equal for",
    sorted(got),
    "bytes_read",
    loader.last_report["bytes_read"],
)
assert LoadConfig(load_format="safetensors").load_format.value == "safetensors"
try:
    LoadConfig(load_format="stagingx")
except ValueError as e:
    print("an unknown format is still SGLang's error:", e)
else:
    raise AssertionError("LoadConfig took an unknown format")
