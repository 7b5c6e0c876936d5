"""vLLM's own plugin loader finds `safetensors_staging.vllm:register` through the entry point.

`get_model_loader(LoadConfig(load_format="staging"))` then returns our StagingModelLoader (check 1
of scripts/check-vllm.sh).
"""

import importlib.metadata

import safetensors.torch  # noqa: F401 (unused here; imported before vLLM, as before)
import torch
import vllm

print("vllm", vllm.__version__, "torch", torch.__version__)
from vllm.plugins import load_general_plugins  # noqa: E402 (after the print, as before)

load_general_plugins()
# After the plugins are loaded, as before.
from vllm.config.load import LoadConfig  # noqa: E402
from vllm.model_executor.model_loader import get_model_loader  # noqa: E402

import safetensors_staging.vllm as plugin  # noqa: E402

loader = get_model_loader(
    LoadConfig(load_format="staging", model_loader_extra_config={"backend": "host"})
)
assert type(loader) is plugin.StagingModelLoader, type(loader)
print(
    "plugin found through",
    [e.value for e in importlib.metadata.entry_points(group="vllm.general_plugins")],
)
print(
    "get_model_loader(load_format='staging') ->",
    type(loader).__module__ + "." + type(loader).__qualname__,
)
