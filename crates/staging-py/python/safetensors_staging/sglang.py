"""SGLang: a model loader reading safetensors through this library.

```bash
pip install 'safetensors-staging[sglang]'    # the plugin is found through its entry point
sglang serve --model-path MODEL_DIR --load-format staging \\
    --model-loader-extra-config '{"backend": "cufile"}'
```

or, from Python, with the class itself:

```python
import sglang
from safetensors_staging.sglang import StagingModelLoader

engine = sglang.Engine(model_path="MODEL_DIR", load_format=StagingModelLoader,
                       model_loader_extra_config='{"backend": "cufile"}')
```

SGLang's `get_model_loader` uses a loader class given as `load_format` as it is. The package
declares `register` in SGLang's plugin group `sglang.srt.plugins`, so SGLang's `load_plugins()`
calls it in each of its processes before it reads its arguments.

The class is SGLang's own `DefaultModelLoader` (so SGLang builds the model, calls
`model.load_weights` and runs its post-processing as usual) whose weights come from this
library: full tensors, each owning its memory, on the model's device. A model path that is a Hub
model id (`--model-path org/name`) streams its weights from `hf://org/name@<revision>` (into the
Hugging Face cache) instead of downloading them first. The extra-config keys are
those of the vLLM plugin (`weights`, `backend`, `device_memory`, `chunk_size`, `threads`,
`share_reads`, remote options, `cache`, `cache_dir`); an unknown key is an error naming them. Nothing here imports
SGLang before SGLang calls `register` or the class is asked for.

SGLang's `update_weights_from_disk` (`--load-format staging`, or `load_format="staging"` in the
request) reloads through the same class, in place: `model.load_weights` copies each tensor into
its parameter. Its loader is made with no extra config; it reads with the server's
`--model-loader-extra-config`.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Tuple

from . import _engines
from ._engines import EXTRA_CONFIG_KEYS, LOAD_FORMAT

__all__ = [
    "EXTRA_CONFIG_KEYS",
    "LOAD_FORMAT",
    "StagingModelLoader",  # noqa: F822 (made when first asked for: `__getattr__`)
    "register",
]


def _server_extra_config(load_config: Any) -> Any:
    """The extra config a loader made for `load_config` reads: its own, or, when it has none,
    the server's `--model-loader-extra-config` when the server's load format is this one too.
    SGLang's `update_weights_from_disk` makes its `LoadConfig` from the load format alone, so
    without this a reload would read with the library's defaults rather than as the server was
    told (`backend`, `device_memory`, ...). A server started with another format keeps its
    extra config for that format's loader."""
    extra = getattr(load_config, "model_loader_extra_config", None)
    if extra:
        return extra
    server = _server_args()
    server_format = getattr(server, "load_format", None)
    ours = server_format is __getattr__("StagingModelLoader") or (
        isinstance(server_format, str) and server_format.lower() == LOAD_FORMAT
    )
    return getattr(server, "model_loader_extra_config", None) if ours else extra


def _server_args() -> Any:
    """SGLang's arguments of the server running in this process, or None (no server: a script,
    a test)."""
    try:
        from sglang.srt.runtime_context import get_server_args
    except ImportError:  # SGLang before the runtime context
        try:
            from sglang.srt.server_args import get_global_server_args as get_server_args
        except ImportError:
            return None
    try:
        return get_server_args()
    except Exception:  # noqa: BLE001 (not set in this process: no server)
        return None


# The hooked check: SGLang turns a format string into its closed `LoadFormat` enum there.
_VERIFY = "sglang.srt.configs.load_config.LoadConfig._verify_load_format"
_registered = False


def _make_loader_class() -> type:
    from sglang.srt.model_loader.loader import BaseModelLoader, DefaultModelLoader

    class StagingModelLoader(_engines.EngineLoaderMixin, DefaultModelLoader):
        """SGLang's `DefaultModelLoader` reading safetensors through `safetensors_staging`.

        Args:
            load_config: SGLang's `LoadConfig`; its `model_loader_extra_config` takes the keys
                of `EXTRA_CONFIG_KEYS`.

        Raises:
            ValueError: an unknown extra-config key, or a value of the wrong kind.
        """

        def __init__(self, load_config: Any) -> None:
            # DefaultModelLoader's own __init__ accepts only its extra-config keys.
            BaseModelLoader.__init__(self, load_config)
            self._configure(load_config, _server_extra_config(load_config))

        def _download_weights_from_hf(self) -> Callable[..., str]:
            from sglang.srt.model_loader.weight_utils import download_weights_from_hf

            return download_weights_from_hf

        def _world_group_coordinator(self) -> Any:
            from sglang.srt.distributed.parallel_state import get_world_group

            return get_world_group()

        def download_model(self, model_config: Any) -> None:
            """Downloads the model's safetensors files, unless the weights are a URL or a Hub
            model's (streamed through `hf://` as they load)."""
            self._prepare_download(model_config.model_path, model_config.revision)

        def _get_weights_iterator(self, source: Any) -> Iterator[Tuple[str, Any]]:
            # A `weights` URL holds the model's own weights, not those of a prefixed source.
            weights = self._staged_weights(
                source.model_or_path, source.revision, url_applies=not source.prefix
            )
            draft = getattr(self.load_config, "draft_model_idx", None)
            if draft is not None:
                return iter(self._filter_mtp_weights(weights, source.prefix, draft))
            return ((source.prefix + name, tensor) for name, tensor in weights)

    return StagingModelLoader


def register() -> None:
    """Makes `--load-format staging` SGLang's `StagingModelLoader`.

    SGLang's plugin hook (entry-point group `sglang.srt.plugins`). It adds `staging` to the
    choices of `--load-format` and hooks `LoadConfig._verify_load_format` (through SGLang's
    `HookRegistry`) so that the string `staging` becomes the class; every other format is left
    to SGLang. Idempotent: SGLang calls it in every process, and a second call in one process
    changes nothing.
    """
    global _registered
    if _registered:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    try:
        from sglang.srt.arg_groups import choices
    except ImportError:  # SGLang before the argument groups kept the choices in server_args
        from sglang.srt import server_args as choices  # type: ignore[no-redef]
    if LOAD_FORMAT not in choices.LOAD_FORMAT_CHOICES:
        choices.add_load_format_choices([LOAD_FORMAT])
    HookRegistry.register(_VERIFY, _verify_load_format, HookType.AROUND)
    _registered = True


def _verify_load_format(original: Any, load_config: Any) -> None:
    """Around SGLang's `LoadConfig._verify_load_format`: the string `staging` (any case) becomes
    the loader class, which SGLang's `get_model_loader` then uses as it is."""
    if isinstance(load_config.load_format, str) and load_config.load_format.lower() == LOAD_FORMAT:
        load_config.load_format = __getattr__("StagingModelLoader")
        return None
    return original(load_config)


__getattr__ = _engines.lazy_class(_make_loader_class, "StagingModelLoader", __name__)
