"""SGLang's own update_weights_from_disk (the WeightUpdater of a running server) with
load_format "staging": the model reloaded in place through the library, with the server's
--model-loader-extra-config (published as each SGLang process publishes its arguments)."""

import tempfile
from pathlib import Path

import safetensors.torch
import sglang.srt.model_executor.model_runner_components.weight_updater as updater_module
import torch
from sglang.srt.plugins import load_plugins
from sglang.srt.runtime_context import SpawnRanks, publish
from sglang.srt.server_args import prepare_server_args

import safetensors_staging._engines as engines

load_plugins()
d = Path(tempfile.mkdtemp())
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
        '{"backend": "host", "chunk_size": "4KiB"}',
    ]
)
args.resolve_once()
publish(args, role="test", ranks=SpawnRanks(world_rank=0))  # what each SGLang process does


# What SGLang's models offer: load_weights copying into the parameters.
class Model(torch.nn.Module):
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
step = {
    "embed.weight": torch.randn(64, 16, generator=g),
    "proj.weight": torch.randn(8, 16, generator=g),
}
(d / "step1").mkdir()
safetensors.torch.save_file(step, d / "step1" / "model.safetensors")
model = Model()
memory = {name: p.data_ptr() for name, p in model.named_parameters()}
reads = []
stream = engines.stream
engines.stream = lambda source, device, options, *rest: (
    reads.append(options) or stream(source, device, options, *rest)
)


class ModelConfig:
    model_path, revision, dtype, hf_config = str(d / "qwen2"), None, torch.float32, None


updater = updater_module.WeightUpdater(
    tp_rank=0,
    device="cpu",
    gpu_id=0,
    model_config=ModelConfig(),
    custom_weight_loaders={},
    get_model=lambda: model,
    update_model_fields=lambda *a, **k: None,
    recapture_cuda_graph=lambda: None,
    get_model_runner=lambda: None,
)
ok, message = updater.update_weights_from_disk(str(d / "step1"), "staging")
assert ok, message
for name, p in model.named_parameters():
    assert torch.equal(p.data, step[name]) and p.data_ptr() == memory[name], name
assert reads == [{"backend": "host", "chunk_size": "4KiB"}], reads
print(
    "update_weights_from_disk(load_format='staging'):",
    message,
    "in place, bytes equal, read with",
    reads[0],
)
