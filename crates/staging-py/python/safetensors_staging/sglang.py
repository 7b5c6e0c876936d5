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

The class is SGLang's own `DefaultModelLoader` but for where the bytes come from: SGLang chooses
the files (as for `--load-format safetensors`: `--model-checksum`, `SGLANG_SORT_WEIGHT_FILES`, a
model's file patterns, GLM4's `mtp.safetensors`), builds the model, calls `model.load_weights`
and runs its post-processing as usual. The tensors are full, each owning its memory, on SGLang's
device (`device_config.device`; host tensors for a device other than a GPU, as SGLang's own
loader gives). A model SGLang loads with a loader of its own because of its quantization
(`auto-round-int8`, ModelOpt's) is refused by name: use `--load-format auto` for it. A model
path that is a Hub model id (`--model-path org/name`) streams its weights from
`hf://org/name@<revision>` (into the Hugging Face cache) instead of downloading them first. The
extra-config keys are those of the vLLM plugin (`weights`, `backend`, `device_memory`,
`chunk_size`, `threads`, `share_reads`, remote options, `cache`, `cache_dir`); an unknown key is
an error naming them. Nothing here imports SGLang before SGLang calls `register` or the class is
asked for.

SGLang's `update_weights_from_disk` (`--load-format staging`, or `load_format="staging"` in the
request) reloads through the same class, in place: `model.load_weights` copies each tensor into
its parameter. Its loader is made with no extra config; it reads with the server's
`--model-loader-extra-config`.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional, Tuple

from . import _engines
from ._engines import EXTRA_CONFIG_KEYS, LOAD_FORMAT

__all__ = [
    "EXTRA_CONFIG_KEYS",
    "LOAD_FORMAT",
    "StagingModelLoader",  # noqa: F822 (made when first asked for: `__getattr__`)
    "register",
]


def _server_extra_config(load_config: Any) -> Tuple[Any, Optional[str]]:
    """The extra config a loader made for `load_config` reads, and the model path its
    `weights` were given for when that is known: its own extra config (path unknown), or, when
    it has none, the server's `--model-loader-extra-config` (for the server's `--model-path`)
    when the server's load format is this one too. SGLang's `update_weights_from_disk` makes its
    `LoadConfig` from the load format alone, so without this a reload would read with the
    library's defaults rather than as the server was told (`backend`, `device_memory`, ...);
    and a reload from another path reads that path, not the server's `weights`. A server
    started with another format keeps its extra config for that format's loader."""
    extra = getattr(load_config, "model_loader_extra_config", None)
    if extra:
        return extra, None
    server = _server_args()
    server_format = getattr(server, "load_format", None)
    ours = server_format is __getattr__("StagingModelLoader") or (
        isinstance(server_format, str) and server_format.lower() == LOAD_FORMAT
    )
    if not ours:
        return extra, None
    return getattr(server, "model_loader_extra_config", None), getattr(server, "model_path", None)


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


# SGLang's quantizations that `get_model_loader` gives a loader of their own (which a class as
# `load_format` bypasses): `auto-round-int8` (IncModelLoader) and ModelOpt's (ModelOptModelLoader).
_OWN_LOADER_QUANTIZATIONS = ("auto-round-int8",)
_MODELOPT_QUANTIZATIONS = ("modelopt_fp8", "modelopt_fp4", "modelopt_mixed", "modelopt")


def _refuse_quantization_with_a_loader_of_its_own(model_config: Any, load_config: Any) -> None:
    """SGLang's `get_model_loader` uses a loader class given as `load_format` before it looks
    at the quantization, so `staging` would load, as plain weights, a checkpoint SGLang gives a
    loader of its own (`IncModelLoader`, `ModelOptModelLoader`). Such a model is refused by
    name instead, as SGLang decides it (an online `modelopt_fp4` without a ModelOpt workflow
    stays with the default loader)."""

    def refused(what: str, loader: str) -> ValueError:
        return ValueError(
            f"load format {LOAD_FORMAT!r} reads plain safetensors through SGLang's "
            f"DefaultModelLoader; SGLang loads {what} with {loader}. "
            "Use --load-format auto for this model."
        )

    quantization = getattr(model_config, "quantization", None)
    if quantization in _OWN_LOADER_QUANTIZATIONS:
        raise refused(f"quantization {quantization!r}", "IncModelLoader")
    modelopt = getattr(load_config, "modelopt_config", None)
    workflow = modelopt is not None and any(
        getattr(modelopt, key, None)
        for key in ("checkpoint_restore_path", "checkpoint_save_path", "export_path")
    )
    already = getattr(model_config, "_is_already_quantized", lambda: True)
    fp4_online = quantization == "modelopt_fp4" and not already() and not workflow
    if not fp4_online and (
        getattr(model_config, "modelopt_quant", None) or quantization in _MODELOPT_QUANTIZATIONS
    ):
        what = quantization or model_config.modelopt_quant
        raise refused(f"ModelOpt quantization {what!r}", "ModelOptModelLoader")


def _make_loader_class() -> type:
    from sglang.srt.configs.load_config import LoadFormat
    from sglang.srt.model_loader.loader import DefaultModelLoader

    class StagingModelLoader(_engines.EngineLoaderMixin, DefaultModelLoader):
        """SGLang's `DefaultModelLoader` whose tensors come from `safetensors_staging`.

        Everything else is SGLang's: which files (`_prepare_weights`, as for its load format
        `safetensors`: a model's `allow_patterns_overrides`, `--model-checksum`,
        `SGLANG_SORT_WEIGHT_FILES`, the download; GLM4's `mtp.safetensors`), draft-model
        layers, `secondary_weights`, building the model, `model.load_weights` and the
        post-processing, and the device (`device_config`). SGLang's checkpoint prefetch does
        not apply (this library reads the files itself).

        Args:
            load_config: SGLang's `LoadConfig`; its `model_loader_extra_config` takes the keys
                of `EXTRA_CONFIG_KEYS`.

        Raises:
            ValueError: an unknown extra-config key, or a value of the wrong kind.
        """

        def __init__(self, load_config: Any) -> None:
            extra, self._weights_of = _server_extra_config(load_config)
            self._configure(load_config, extra)
            # SGLang's own checks and state, for the format whose files this loader reads.
            DefaultModelLoader.__init__(
                self, _engines.with_format(load_config, LoadFormat.SAFETENSORS, {})
            )
            self.load_config = load_config

        def _world_group_coordinator(self) -> Any:
            from sglang.srt.distributed.parallel_state import get_world_group

            return get_world_group()

        def _engine_device(self) -> Any:
            # An update from disk: the server's device (SGLang's WeightUpdater loads there).
            return getattr(_server_args(), "device", None)

        def _prepare_weights(self, *args: Any, **kwargs: Any) -> Any:
            """SGLang's file choice, as for its load format `safetensors`."""
            with self._as_format(LoadFormat.SAFETENSORS):
                return super()._prepare_weights(*args, **kwargs)

        def download_model(self, model_config: Any) -> None:
            """SGLang's download of the model's safetensors files (of the `weights`
            directory, when given), unless the weights stream from a URL or the Hub."""
            model, revision = model_config.model_path, model_config.revision
            self._pin(model, model_config)
            if self._streamed(model, revision, own=True, plain=True) is None:
                self._prepare_weights(self._model_dir(model, True), revision, fall_back_to_pt=True)

        def load_model(self, *, model_config: Any, device_config: Any) -> Any:
            """SGLang's `load_model`, with the tensors on `device_config.device`; a
            quantization SGLang gives a loader of its own is refused by name."""
            _refuse_quantization_with_a_loader_of_its_own(model_config, self.load_config)
            self._pin(model_config.model_path, model_config)
            self._target = device_config.device
            try:
                return super().load_model(model_config=model_config, device_config=device_config)
            finally:
                self._target = None

        def _get_weights_iterator(
            self,
            source: Any,
            *,
            resolved_source: Any = None,
            startup_prefetch_started: bool = False,
            startup_prefetch_active: bool = False,
        ) -> Iterator[Tuple[str, Any]]:
            """SGLang's `_get_weights_iterator` with this library reading the tensors (the
            prefetch flags change nothing: there is no page-cache prefetch to coordinate)."""
            import time

            plain = not source.prefix and getattr(source, "allow_patterns_overrides", None) is None
            # The model's own source is the one SGLang makes with its model config.
            own = getattr(source, "model_config", None) is not None or plain
            files: Any = self._streamed(source.model_or_path, source.revision, own, plain)
            if files is not None:
                checksum = getattr(_server_args(), "model_checksum", None)
                if checksum is not None:
                    raise ValueError(
                        f"--model-checksum {checksum!r} verifies local files before they are "
                        f"read; load format {LOAD_FORMAT!r} streams these weights from "
                        f"{files!r}. Download the model and give it as a local path (or as "
                        "the `weights` directory), or drop --model-checksum."
                    )
            elif resolved_source is not None:
                files = list(resolved_source.weight_files)
            else:
                from sglang.srt.model_loader.weight_utils import maybe_add_mtp_safetensors

                hf_folder, files, _ = self._prepare_weights(
                    self._model_dir(source.model_or_path, own),
                    source.revision,
                    source.fall_back_to_pt,
                    getattr(source, "allow_patterns_overrides", None),
                )
                if getattr(source, "model_config", None) is not None:
                    files = maybe_add_mtp_safetensors(
                        files,
                        hf_folder,
                        "model.safetensors.index.json",
                        source.model_config.hf_config,
                    )
            weights = self._read(files)
            draft = getattr(self.load_config, "draft_model_idx", None)
            if draft is not None:
                return self._filter_mtp_weights(weights, source.prefix, draft)
            if self.counter_before_loading_weights == 0.0:
                self.counter_before_loading_weights = time.perf_counter()
            return ((source.prefix + name, tensor) for name, tensor in weights)

    return StagingModelLoader


def register() -> None:
    """Makes `--load-format staging` SGLang's `StagingModelLoader`.

    SGLang's plugin hook (entry-point group `sglang.srt.plugins`). It hooks
    `LoadConfig._verify_load_format` (through SGLang's `HookRegistry`) so that the string
    `staging` becomes the class, then adds `staging` to the choices of `--load-format`; every
    other format is left to SGLang. Idempotent: SGLang calls it in every process, and a second
    call in one process changes nothing.

    Raises:
        RuntimeError: this SGLang lacks what the plugin needs (its loader class, the hook
            registry, the format choices), naming it. SGLang only logs a failing plugin, so
            nothing is half done: `staging` is offered as a choice only once its hook is in
            place (else `--load-format staging` is SGLang's "invalid choice").
    """
    global _registered
    if _registered:
        return
    try:
        __getattr__("StagingModelLoader")  # the loader class SGLang will be given
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        try:
            from sglang.srt.arg_groups import choices
        except ImportError:  # SGLang before the argument groups kept the choices in server_args
            from sglang.srt import server_args as choices  # type: ignore[no-redef]
        add_choices = choices.add_load_format_choices
        offered = choices.LOAD_FORMAT_CHOICES
        HookRegistry.register(_VERIFY, _verify_load_format, HookType.AROUND)
    except Exception as e:  # noqa: BLE001 (any failure is this one, said plainly)
        raise RuntimeError(
            f"safetensors-staging cannot register load format {LOAD_FORMAT!r} with this SGLang "
            f"({_sglang_version()}): {type(e).__name__}: {e}. --load-format {LOAD_FORMAT} is "
            "not available; safetensors_staging.sglang.StagingModelLoader as the load format may "
            "still work."
        ) from e
    if LOAD_FORMAT not in offered:
        add_choices([LOAD_FORMAT])
    _registered = True


def _sglang_version() -> str:
    try:
        import importlib.metadata

        return f"sglang {importlib.metadata.version('sglang')}"
    except Exception:  # noqa: BLE001 (not installed as a distribution)
        return "sglang of unknown version"


def _verify_load_format(original: Any, load_config: Any) -> None:
    """Around SGLang's `LoadConfig._verify_load_format`: the string `staging` (any case) becomes
    the loader class, which SGLang's `get_model_loader` then uses as it is."""
    if isinstance(load_config.load_format, str) and load_config.load_format.lower() == LOAD_FORMAT:
        load_config.load_format = __getattr__("StagingModelLoader")
        return None
    return original(load_config)


__getattr__ = _engines.lazy_class(_make_loader_class, "StagingModelLoader", __name__)
