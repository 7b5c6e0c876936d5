"""vLLM plugin: `--load-format staging` reads the weights through this library.

```bash
pip install 'safetensors-staging[vllm]'      # the plugin is found through its entry point
vllm serve MODEL_DIR --load-format staging \\
    --model-loader-extra-config '{"backend": "cufile", "device_memory": "60GiB"}'
```

The package declares `register` in the entry-point group `vllm.general_plugins`, so vLLM calls it
in each of its processes; it registers `StagingModelLoader` under the load format `staging`.
Nothing here imports vLLM (or CUDA) before vLLM itself calls `register` or the class is asked for.

The loader yields full tensors (each model narrows them to its rank's share itself), each owning
its memory (vLLM models may keep a tensor past the next step of the iterator), on vLLM's current
device. Keys of `--model-loader-extra-config` (an unknown key is an error naming these):

- `weights`: where the weights are, when not in the model directory: a directory or a URL the
  library reads (`hf://`, `s3://`, `gs://`, `az://`, `http(s)://` and their aliases: `s3a://`,
  `abfs://`, ...; vLLM refuses such a model path for formats not its own, so keep the config in
  a local directory given as the model and the weights here). Without it, a model given as a
  Hub id (`vllm serve org/name --load-format staging`) streams its weights from
  `hf://org/name@<revision>` into the Hugging Face cache as they load, instead of downloading
  them first (vLLM fetches the config itself; `ignore_patterns` do not apply: the library
  reads the index, else `model.safetensors`, else every `*.safetensors` at the root);
- `backend` (`auto`, `host`, `cufile`, `hipfile`), `device_memory` (a size: the cap on the device
  memory the load holds), `chunk_size`, `threads`;
- `share_reads`: read each byte once across vLLM's world group and broadcast it (as
  `process_group=` does);
- the remote options `concurrency`, `range_size`, `retries`, `bandwidth`, `store_options`,
  `allow_redirect`;
- for a Hub model: `cache` (false: stream without writing the Hugging Face cache) and
  `cache_dir` (default: vLLM's `--download-dir`, else `HF_HUB_CACHE`, else `$HF_HOME/hub`).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Tuple

from . import _engines
from ._engines import EXTRA_CONFIG_KEYS, LOAD_FORMAT, weight_files

__all__ = [
    "EXTRA_CONFIG_KEYS",
    "LOAD_FORMAT",
    "StagingModelLoader",  # noqa: F822 (made when first asked for: `__getattr__`)
    "register",
    "weight_files",
]


def _make_loader_class() -> type:
    from vllm.model_executor.model_loader import BaseModelLoader

    class StagingModelLoader(_engines.EngineLoaderMixin, BaseModelLoader):
        """vLLM's `BaseModelLoader` reading safetensors through `safetensors_staging`.

        Args:
            load_config: vLLM's `LoadConfig`; its `model_loader_extra_config` takes the keys
                of `EXTRA_CONFIG_KEYS`.

        Raises:
            ValueError: an unknown extra-config key, or a value of the wrong kind.
        """

        def __init__(self, load_config: Any) -> None:
            super().__init__(load_config)
            self._configure(load_config)

        def _download_weights_from_hf(self) -> Callable[..., str]:
            from vllm.model_executor.model_loader.weight_utils import download_weights_from_hf

            return download_weights_from_hf

        def _world_group_coordinator(self) -> Any:
            from vllm.distributed.parallel_state import get_world_group

            return get_world_group()

        def download_model(self, model_config: Any) -> None:
            """Downloads the model's safetensors files, unless the weights are a URL or a Hub
            model's (streamed through `hf://` as they load)."""
            self._prepare_download(model_config.model, model_config.revision)

        def weights_iterator(self, model_config: Any) -> Iterator[Tuple[str, Any]]:
            """`(name, tensor)` for every tensor, full, owning its memory, on vLLM's device."""
            yield from self._staged_weights(model_config.model, model_config.revision)

        def get_all_weights(self, model_config: Any, model: Any) -> Iterator[Tuple[str, Any]]:
            """Every weight, as vLLM's in-place reload asks for them
            (`collective_rpc("reload_weights")`, the weight-transfer paths): the same
            `(name, tensor)` pairs as `weights_iterator`, read through the library."""
            yield from self.weights_iterator(model_config)

        def load_weights(self, model: Any, model_config: Any) -> None:
            """Loads every weight into `model` (`model.load_weights`).

            Raises:
                ValueError: a parameter was not in the checkpoint (unless quantized).
            """
            wanted = {name for name, _ in model.named_parameters()}
            loaded = model.load_weights(self.weights_iterator(model_config))
            # As vLLM's default loader: every parameter from the checkpoint, unless quantized.
            if loaded is not None and getattr(model_config, "quantization", None) is None:
                missing = wanted - set(loaded)
                if missing:
                    raise ValueError(
                        f"Following weights were not initialized from checkpoint: {sorted(missing)}"
                    )

    return StagingModelLoader


__getattr__ = _engines.lazy_class(_make_loader_class, "StagingModelLoader", __name__)


def register() -> None:
    """Registers `StagingModelLoader` as vLLM's load format `staging`.

    The `vllm.general_plugins` entry point; calling it again does nothing.
    """
    from vllm.model_executor.model_loader import register_model_loader

    loader = __getattr__("StagingModelLoader")
    if getattr(register, "_done", None) is loader:
        return
    register_model_loader(LOAD_FORMAT)(loader)
    register._done = loader  # type: ignore[attr-defined]
