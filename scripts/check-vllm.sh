#!/usr/bin/env bash
# The vLLM plugin against the real vLLM, on a CPU: installs vLLM (several GB of CUDA wheels) in a
# venv of its own, then checks that
#   1. vLLM's own plugin loader finds `safetensors_staging.vllm:register` through the entry point;
#   2. `get_model_loader(LoadConfig(load_format="staging"))` returns our StagingModelLoader;
#   3. its `load_weights` fills a small torch module with a `load_weights` method, bytes checked;
#   4. vLLM's own in-place `reload_weights` (what `collective_rpc("reload_weights")` runs) with
#      load format `staging` reads through the plugin's `get_all_weights` into the same memory;
#   5. the stand-ins the CI tests use have the real signatures (test_standins_have_the_real_signatures).
# No engine starts: vLLM needs a GPU for that. Usage: [WHEEL=...] scripts/check-vllm.sh [VENV_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-target/vllm-venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check vllm pytest safetensors
# WHEEL=path/to/safetensors_staging-*.whl installs a wheel already built instead of building one.
"$venv/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps "${WHEEL:-./crates/staging-py}"
"$venv/bin/python" - <<'PY'
import json, tempfile, importlib.metadata
from pathlib import Path
import torch, safetensors.torch
import vllm
print("vllm", vllm.__version__, "torch", torch.__version__)
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.config.load import LoadConfig
from vllm.model_executor.model_loader import get_model_loader
import safetensors_staging.vllm as plugin
loader = get_model_loader(LoadConfig(load_format="staging", model_loader_extra_config={"backend": "host"}))
assert type(loader) is plugin.StagingModelLoader, type(loader)
print("plugin found through", [e.value for e in importlib.metadata.entry_points(group="vllm.general_plugins")])
print("get_model_loader(load_format='staging') ->", type(loader).__module__ + "." + type(loader).__qualname__)

from vllm.model_executor.model_loader.reload import record_metadata_for_reloading
from vllm.model_executor.model_loader.weight_utils import default_weight_loader

class Model(torch.nn.Module):  # as vLLM's models load: each parameter's weight_loader
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(64, 16)
        self.proj = torch.nn.Linear(16, 8)
    def load_weights(self, weights):
        params, done = dict(self.named_parameters()), set()
        for name, tensor in weights:
            param = params[name]
            getattr(param, "weight_loader", default_weight_loader)(param, tensor)
            done.add(name)
        return done

class ModelConfig:
    def __init__(self, model):
        self.model, self.revision, self.quantization, self.model_weights = model, None, None, ""

g = torch.Generator().manual_seed(1)
want = {"embed.weight": torch.randn(64, 16, generator=g), "proj.weight": torch.randn(8, 16, generator=g),
        "proj.bias": torch.randn(8, generator=g)}
d = Path(tempfile.mkdtemp())
safetensors.torch.save_file(want, d / "model.safetensors")
model = Model()
loader.load_weights(model, ModelConfig(str(d)))
for name, param in model.named_parameters():
    assert torch.equal(param, want[name]), name
print("load_weights: bytes equal for", sorted(want), "report", json.dumps({k: loader.last_report[k] for k in ("backend", "tensors", "bytes_read")}))

# vLLM's own in-place reload (`reload_weights`, what `collective_rpc("reload_weights")` runs in
# each worker) with load format `staging`: the weights read through the plugin's
# `get_all_weights`, written into the model's own parameters.
from vllm.model_executor.model_loader.reload.inplace import reload_weights
import safetensors_staging._engines as engines

class VllmConfig:
    def __init__(self, model, load_config):
        self.model_config, self.load_config, self.lora_config = ModelConfig(model), load_config, None

step = {name: tensor * 2 for name, tensor in want.items()}
(d / "step1").mkdir()
safetensors.torch.save_file(step, d / "step1" / "model.safetensors")
record_metadata_for_reloading(model)  # what vLLM's initialize_model does for every model
memory = {name: p.data_ptr() for name, p in model.named_parameters()}
reads = []
stream = engines.stream
engines.stream = lambda source, device, options, *rest: reads.append(source) or stream(source, device, options, *rest)
config = VllmConfig(str(d), LoadConfig(load_format="staging", model_loader_extra_config={"backend": "host"}))
reload_weights(config, model, None, str(d / "step1"), True)
for name, p in model.named_parameters():
    assert torch.equal(p.data, step[name]) and p.data_ptr() == memory[name], name
assert reads == [[str(d / "step1" / "model.safetensors")]], reads
print("reload_weights(load_format='staging'): in place, bytes equal, read through the library from", reads[0])
PY
"$venv/bin/python" -m pytest -q -p no:cacheprovider crates/staging-py/tests/test_engines_vllm.py -k real_signatures -rs
