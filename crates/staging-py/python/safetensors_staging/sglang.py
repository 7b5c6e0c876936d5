"""SGLang: a model loader reading safetensors through this library.

    pip install 'safetensors-staging[sglang]'    # the plugin is found through its entry point
    sglang serve --model-path MODEL_DIR --load-format staging \\
        --model-loader-extra-config '{"backend": "cufile"}'

or, from Python, with the class itself:

    import sglang
    from safetensors_staging.sglang import StagingModelLoader

    engine = sglang.Engine(model_path="MODEL_DIR", load_format=StagingModelLoader,
                           model_loader_extra_config='{"backend": "cufile"}')

SGLang's `get_model_loader` uses a loader class given as `load_format` as it is. The package
declares `register` in SGLang's plugin group `sglang.srt.plugins`, so SGLang's `load_plugins()`
calls it in each of its processes before it reads its arguments; `register` adds `staging` to
the choices of `--load-format` and hooks `LoadConfig._verify_load_format` (through SGLang's
`HookRegistry`) so that the string `staging` becomes this class; every other format is left to
SGLang.

The class is SGLang's own `DefaultModelLoader` (so SGLang builds the model, calls
`model.load_weights` and runs its post-processing as usual) whose weights come from this
library: full tensors, each owning its memory, on the model's device. The extra-config keys are
those of the vLLM plugin (`weights`, `backend`, `device_memory`, `chunk_size`, `threads`,
`share_reads`, remote options); an unknown key is an error naming them. Nothing here imports
SGLang before SGLang calls `register` or the class is asked for.
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
__all__ = ["LOAD_FORMAT", "EXTRA_CONFIG_KEYS", "StagingModelLoader", "register"]

# The hooked check: SGLang turns a format string into its closed `LoadFormat` enum there.
_VERIFY = "sglang.srt.configs.load_config.LoadConfig._verify_load_format"
_registered = False


def _world_group(device: str) -> Any:
    from sglang.srt.distributed.parallel_state import get_world_group

    return devices_group(get_world_group(), device)


def _make_loader_class() -> type:
    from sglang.srt.model_loader.loader import BaseModelLoader, DefaultModelLoader

    class StagingModelLoader(DefaultModelLoader):
        """SGLang's `DefaultModelLoader` reading safetensors through `safetensors_staging`."""

        def __init__(self, load_config: Any) -> None:
            # DefaultModelLoader's own __init__ accepts only its extra-config keys.
            BaseModelLoader.__init__(self, load_config)
            self.weights, self.share_reads, self.options = parse_extra_config(
                getattr(load_config, "model_loader_extra_config", None), LOAD_FORMAT)
            self.last_report: Optional[Dict[str, Any]] = None

        def _local_dir(self, model_or_path: str, revision: Optional[str]) -> str:
            if self.weights is not None and not is_url(self.weights):
                return self.weights
            if os.path.isdir(model_or_path):
                return model_or_path
            from sglang.srt.model_loader.weight_utils import download_weights_from_hf

            return download_weights_from_hf(model_or_path, self.load_config.download_dir, ["*.safetensors"],
                                            revision, ignore_patterns=self.load_config.ignore_patterns)

        def download_model(self, model_config: Any) -> None:
            if not is_url(self.weights):
                self._local_dir(model_config.model_path, model_config.revision)

        def _get_weights_iterator(self, source: Any) -> Iterator[Tuple[str, Any]]:
            device = current_device()
            if is_url(self.weights) and not source.prefix:
                files: Any = self.weights
            else:
                files = weight_files(self._local_dir(source.model_or_path, source.revision),
                                     self.load_config.ignore_patterns, LOAD_FORMAT)
            group = _world_group(device) if self.share_reads else None
            weights = stream(files, device, self.options, group, self._keep_report)
            draft = getattr(self.load_config, "draft_model_idx", None)
            if draft is not None:
                return iter(self._filter_mtp_weights(weights, source.prefix, draft))
            return ((source.prefix + name, tensor) for name, tensor in weights)

        def _keep_report(self, report: Dict[str, Any]) -> None:
            self.last_report = report

    StagingModelLoader.__qualname__ = "StagingModelLoader"
    StagingModelLoader.__module__ = __name__
    return StagingModelLoader


def register() -> None:
    """SGLang's plugin hook (entry-point group `sglang.srt.plugins`): `--load-format staging`
    becomes `StagingModelLoader`. Idempotent: SGLang calls it in every process, and a second
    call in one process changes nothing."""
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


__getattr__ = lazy_class(_make_loader_class, "StagingModelLoader", __name__)
