"""vLLM plugin: `--load-format staging` reads the weights through this library.

    pip install 'safetensors-staging[vllm]'      # the plugin is found through its entry point
    vllm serve MODEL_DIR --load-format staging \\
        --model-loader-extra-config '{"backend": "cufile", "device_memory": "60GiB"}'

The package declares `register` in the entry-point group `vllm.general_plugins`, so vLLM calls it
in each of its processes; it registers `StagingModelLoader` under the load format `staging`.
Nothing here imports vLLM (or CUDA) before vLLM itself calls `register` or the class is asked for.

The loader yields full tensors (each model narrows them to its rank's share itself), each owning
its memory (vLLM models may keep a tensor past the next step of the iterator), on vLLM's current
device. Keys of `--model-loader-extra-config`:

- `weights`: where the weights are, when not in the model directory: a directory or a URL the
  library reads (`s3://`, `gs://`, `az://`, `http(s)://` and their aliases: `s3a://`, `abfs://`,
  ...; vLLM refuses such a model path for formats not its own, so keep the config in a local
  directory given as the model and the weights here);
- `backend` (`auto`, `host`, `cufile`, `hipfile`), `device_memory` (a size: the cap on the device
  memory the load holds), `chunk_size`, `threads`;
- `share_reads`: read each byte once across vLLM's world group and broadcast it (as
  `process_group=` does);
- the remote options `concurrency`, `range_size`, `retries`, `bandwidth`, `store_options`,
  `allow_redirect`.

An unknown key is an error naming the accepted ones.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Iterator, Optional, Tuple

from ._engines import (
    EXTRA_CONFIG_KEYS,
    current_device,
    devices_group,
    is_url,
    lazy_class,
    parse_extra_config,
    stream,
    weight_files,
)

LOAD_FORMAT = "staging"
__all__ = ["LOAD_FORMAT", "EXTRA_CONFIG_KEYS", "StagingModelLoader", "register", "weight_files"]

def _world_group(device: str) -> Any:
    from vllm.distributed.parallel_state import get_world_group

    return devices_group(get_world_group(), device)


def _make_loader_class() -> type:
    from vllm.model_executor.model_loader import BaseModelLoader

    class StagingModelLoader(BaseModelLoader):
        """vLLM's `BaseModelLoader` reading safetensors through `safetensors_staging`."""

        def __init__(self, load_config: Any) -> None:
            super().__init__(load_config)
            self.weights, self.share_reads, self.options = parse_extra_config(
                getattr(load_config, "model_loader_extra_config", None), LOAD_FORMAT)
            self.last_report: Optional[Dict[str, Any]] = None

        def _local_dir(self, model_config: Any) -> str:
            if self.weights is not None and not is_url(self.weights):
                return self.weights
            model = model_config.model
            if os.path.isdir(model):
                return model
            from vllm.model_executor.model_loader.weight_utils import download_weights_from_hf

            return download_weights_from_hf(
                model,
                self.load_config.download_dir,
                ["*.safetensors"],
                model_config.revision,
                ignore_patterns=self.load_config.ignore_patterns,
            )

        def download_model(self, model_config: Any) -> None:
            if not is_url(self.weights):
                self._local_dir(model_config)

        def weights_iterator(self, model_config: Any) -> Iterator[Tuple[str, Any]]:
            """`(name, tensor)` for every tensor, full, owning its memory, on vLLM's device."""
            device = current_device()
            if is_url(self.weights):
                source: Any = self.weights
            else:
                source = weight_files(self._local_dir(model_config), self.load_config.ignore_patterns, LOAD_FORMAT)
            group = _world_group(device) if self.share_reads else None
            yield from stream(source, device, self.options, group, self._keep_report)

        def _keep_report(self, report: Dict[str, Any]) -> None:
            self.last_report = report

        def load_weights(self, model: Any, model_config: Any) -> None:
            wanted = {name for name, _ in model.named_parameters()}
            loaded = model.load_weights(self.weights_iterator(model_config))
            # As vLLM's default loader: every parameter from the checkpoint, unless quantized.
            if loaded is not None and getattr(model_config, "quantization", None) is None:
                missing = wanted - set(loaded)
                if missing:
                    raise ValueError(f"Following weights were not initialized from checkpoint: {sorted(missing)}")

    StagingModelLoader.__qualname__ = "StagingModelLoader"
    StagingModelLoader.__module__ = __name__
    return StagingModelLoader


__getattr__ = lazy_class(_make_loader_class, "StagingModelLoader", __name__)


def register() -> None:
    """The `vllm.general_plugins` entry point: registers `StagingModelLoader` as load format
    `staging`. Calling it again does nothing."""
    from vllm.model_executor.model_loader import register_model_loader

    loader = __getattr__("StagingModelLoader")
    if getattr(register, "_done", None) is loader:
        return
    register_model_loader(LOAD_FORMAT)(loader)
    register._done = loader  # type: ignore[attr-defined]
