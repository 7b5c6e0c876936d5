#!/usr/bin/env bash
# The SGLang loader class against the real SGLang, on a CPU: installs SGLang (several GB) in a venv
# of its own, then checks that SGLang's own `get_model_loader` takes `StagingModelLoader` as
# `load_format`, that its weight iterator over SGLang's `DefaultModelLoader.Source` gives the
# file's bytes, that SGLang's `load_plugins()` finds our entry point so that its own argument
# parser takes `--load-format staging` and its `LoadConfig` turns it into our class, and that the
# stand-ins the CI tests use have the real signatures, and that SGLang's own
# `update_weights_from_disk` with load format `staging` reloads a model in place through the
# library, with the server's extra config. No engine starts
# (SGLang needs a GPU for that). Usage: [WHEEL=...] scripts/check-sglang.sh [VENV_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-target/sglang-venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check sglang pytest safetensors
# WHEEL=path/to/safetensors_staging-*.whl installs a wheel already built instead of building one.
"$venv/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps "${WHEEL:-./crates/staging-py}"
"$venv/bin/python" -W ignore - <<'PY'
import tempfile
from pathlib import Path
import torch, safetensors.torch, sglang
from sglang.srt.configs.load_config import LoadConfig
from sglang.srt.model_loader.loader import DefaultModelLoader, get_model_loader
from safetensors_staging.sglang import StagingModelLoader
print("sglang", sglang.__version__, "torch", torch.__version__)
loader = get_model_loader(LoadConfig(load_format=StagingModelLoader, model_loader_extra_config={"backend": "host"}))
assert type(loader) is StagingModelLoader, type(loader)
print("get_model_loader(load_format=StagingModelLoader) ->", type(loader).__module__ + "." + type(loader).__qualname__)
g = torch.Generator().manual_seed(1)
want = {"embed.weight": torch.randn(64, 16, generator=g), "proj.weight": torch.randn(8, 16, generator=g)}
d = Path(tempfile.mkdtemp())
safetensors.torch.save_file(want, d / "model.safetensors")
got = dict(loader._get_weights_iterator(DefaultModelLoader.Source(str(d), None, prefix="")))
assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
print("weights through SGLang's DefaultModelLoader.Source: bytes equal for", sorted(got),
      "bytes_read", loader.last_report["bytes_read"])

# The plugin: what `sglang serve` does first, then its own argument parsing and LoadConfig.
from importlib.metadata import entry_points
from sglang.srt.plugins import load_plugins
from sglang.srt.server_args import prepare_server_args
print("sglang.srt.plugins entry points:", [f"{e.name} = {e.value}" for e in entry_points(group="sglang.srt.plugins")])
load_plugins()
from transformers import Qwen2Config, Qwen2ForCausalLM
Qwen2ForCausalLM(Qwen2Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                             num_attention_heads=4, num_key_value_heads=2)).save_pretrained(d / "qwen2")
args = prepare_server_args(["--model-path", str(d / "qwen2"), "--device", "cpu", "--load-format", "staging",
                            "--model-loader-extra-config", '{"backend": "host"}'])
args.resolve_once()  # what `sglang serve` does next: SGLang's own checks of the arguments
print("prepare_server_args(--load-format staging) + resolve_once: load_format =", repr(args.load_format))
config = LoadConfig(load_format=args.load_format, model_loader_extra_config=args.model_loader_extra_config)
assert config.load_format is StagingModelLoader, config.load_format
loader = get_model_loader(config)
assert type(loader) is StagingModelLoader, type(loader)
got = dict(loader._get_weights_iterator(DefaultModelLoader.Source(str(d), None, prefix="")))
assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
print("LoadConfig(load_format='staging') ->", type(loader).__qualname__, "bytes equal, bytes_read",
      loader.last_report["bytes_read"])
assert LoadConfig(load_format="safetensors").load_format.value == "safetensors"
try:
    LoadConfig(load_format="stagingx")
except ValueError as e:
    print("an unknown format is still SGLang's error:", e)
else:
    raise AssertionError("LoadConfig took an unknown format")
PY
"$venv/bin/python" -W ignore - <<'PY'
# SGLang's own update_weights_from_disk (the WeightUpdater of a running server) with
# load_format "staging": the model reloaded in place through the library, with the server's
# --model-loader-extra-config. The server's runtime state (its published arguments, the
# pipeline group, the weight-cache mode) is stood in for: no server runs on a CPU.
import tempfile
from pathlib import Path
import torch, safetensors.torch
import sglang.srt.runtime_context as context
import sglang.srt.model_loader.loader as sgl_loader
import sglang.srt.model_loader.weight_utils as weight_utils
import sglang.srt.model_executor.model_runner_components.weight_updater as updater_module
from sglang.srt.plugins import load_plugins
from sglang.srt.server_args import prepare_server_args
import safetensors_staging._engines as engines

load_plugins()
d = Path(tempfile.mkdtemp())
from transformers import Qwen2Config, Qwen2ForCausalLM
Qwen2ForCausalLM(Qwen2Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                             num_attention_heads=4, num_key_value_heads=2)).save_pretrained(d / "qwen2")
args = prepare_server_args(["--model-path", str(d / "qwen2"), "--device", "cpu", "--load-format", "staging",
                            "--model-loader-extra-config", '{"backend": "host", "chunk_size": "4KiB"}'])
context.get_server_args = lambda: args

class Runtime:  # what the updater and the default loader read of the server's runtime state
    weight_cache_mode = "off"; weight_loader_disable_mmap = False; weight_loader_prefetch_checkpoints = False
    weight_loader_prefetch_num_threads = 1; weight_loader_drop_cache_after_load = False; model_checksum = None
updater_module.get_model = sgl_loader.get_model = lambda: Runtime()
updater_module.get_pp_stage_load_group = lambda: weight_utils._DEFAULT_LOAD_GROUP

class Model(torch.nn.Module):  # what SGLang's models offer: load_weights copying into the parameters
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(64, 16)
        self.proj = torch.nn.Linear(16, 8, bias=False)
    def load_weights(self, weights):
        params = dict(self.named_parameters())
        with torch.no_grad():
            for name, tensor in weights:
                params[name].copy_(tensor)

g = torch.Generator().manual_seed(2)
step = {"embed.weight": torch.randn(64, 16, generator=g), "proj.weight": torch.randn(8, 16, generator=g)}
(d / "step1").mkdir()
safetensors.torch.save_file(step, d / "step1" / "model.safetensors")
model = Model()
memory = {name: p.data_ptr() for name, p in model.named_parameters()}
reads = []
stream = engines.stream
engines.stream = lambda source, device, options, *rest: reads.append(options) or stream(source, device, options, *rest)

class ModelConfig:
    model_path, revision, dtype, hf_config = str(d / "qwen2"), None, torch.float32, None
updater = updater_module.WeightUpdater(
    tp_rank=0, device="cpu", gpu_id=0, model_config=ModelConfig(), custom_weight_loaders={},
    get_model=lambda: model, update_model_fields=lambda *a, **k: None,
    recapture_cuda_graph=lambda: None, get_model_runner=lambda: None)
ok, message = updater.update_weights_from_disk(str(d / "step1"), "staging")
assert ok, message
for name, p in model.named_parameters():
    assert torch.equal(p.data, step[name]) and p.data_ptr() == memory[name], name
assert reads == [{"backend": "host", "chunk_size": "4KiB"}], reads
print("update_weights_from_disk(load_format='staging'):", message, "in place, bytes equal, read with",
      reads[0])
PY
"$venv/bin/python" -m pytest -q -p no:cacheprovider crates/staging-py/tests/test_engines_sglang.py -k real_signatures -rs
