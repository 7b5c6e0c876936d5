"""What the engine plugins share: the keys of a loader's extra config, where the tensors go, and
the loader plumbing itself (`EngineLoaderMixin`) over each engine's own default loader."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple
from urllib.parse import quote

from . import _load, _native

# The load format both engines know this library's loader by.
LOAD_FORMAT = "staging"

# The library's options an extra config may hold, spelled as the library spells them
# (`device_memory` is the options table's alias of `memory_cap`).
_OPTIONS = (
    "backend",
    "device_memory",
    "chunk_size",
    "threads",
    "concurrency",
    "range_size",
    "retries",
    "bandwidth",
    "store_options",
    "allow_redirect",
    "cache",
    "cache_dir",
)
EXTRA_CONFIG_KEYS = ("weights", "share_reads", *_OPTIONS)


def is_url(weights: Optional[str]) -> bool:
    """Whether `weights` is a URL, which the library reads itself, rather than a local
    directory: the library's answer."""
    return weights is not None and _native._is_url(weights)


# A full commit id, as `transformers` records one.
_COMMIT = re.compile(r"[0-9a-fA-F]{40}")


def is_hub(path: Any) -> bool:
    """Whether `path` is a Hub path (`hf://...`): the library's answer."""
    return isinstance(path, str) and _native._url_store(path) == "hub"


def is_repo_id(name: Any) -> bool:
    """Whether `name` is a Hub model id (`org/name` or `name`): the library's answer, by
    `huggingface_hub`'s rules."""
    return isinstance(name, str) and _native._is_repo_id(name)


def uses_modelscope() -> bool:
    """Whether the engine fetches model ids from ModelScope rather than the Hugging Face Hub
    (`VLLM_USE_MODELSCOPE`, `SGLANG_USE_MODELSCOPE`): a model id is then the engine's to
    download, not `hf://`."""
    return any(
        os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")
        for name in ("VLLM_USE_MODELSCOPE", "SGLANG_USE_MODELSCOPE")
    )


def hub_path(model: Any, revision: Optional[str] = None) -> Optional[str]:
    """`hf://{model}@{revision}` when `model` names a model on the Hub rather than a local path:
    a model id that is not an existing path (as `transformers` and the engines tell them
    apart) unless the engine fetches ids from ModelScope, or an `hf://` path already (returned
    as it is). `None` otherwise."""
    if is_hub(model):
        return model
    if not is_repo_id(model) or os.path.exists(model) or uses_modelscope():
        return None
    # A revision holding `/` (`refs/pr/1`) is written percent-encoded.
    return f"hf://{model}@{quote(revision or 'main', safe='')}"


def parse_extra_config(
    extra: Any, load_format: str, engine_keys: Tuple[str, ...] = ()
) -> Tuple[Optional[str], bool, Dict[str, Any], Dict[str, Any]]:
    """`(weights, share_reads, options, engine)` from `model_loader_extra_config`.

    Args:
        extra: the extra config: a dict, JSON text, or None.
        load_format: the load format named in errors.
        engine_keys: the keys of the engine's own default loader this one takes too (vLLM's
            `enable_weights_track`), returned in `engine` for that loader.

    Raises:
        ValueError: an unknown key, or a value of the wrong kind.
    """
    if extra is None or extra == "":
        extra = {}
    if isinstance(extra, str):
        extra = json.loads(extra)
    if not isinstance(extra, dict):
        raise ValueError(
            f"model_loader_extra_config for load format {load_format!r} must be a mapping, not {extra!r}"
        )
    accepted = (*EXTRA_CONFIG_KEYS, *engine_keys)
    unknown = sorted(set(extra) - set(accepted))
    if unknown:
        raise ValueError(
            f"unknown key(s) {', '.join(map(repr, unknown))} in model_loader_extra_config for load format "
            f"{load_format!r}; accepted: {', '.join(accepted)}"
        )
    weights = extra.get("weights")
    if weights is not None and not isinstance(weights, str):
        raise ValueError(
            f"model_loader_extra_config 'weights' must be a path or URL, not {weights!r}"
        )
    if is_url(weights) and not is_hub(weights) and _native._url_store(weights) is None:
        raise ValueError(
            f"model_loader_extra_config 'weights' {_native._redacted(weights)!r} is a URL of a scheme this "
            "library does not read"
        )
    share_reads = extra.get("share_reads", False)
    if not isinstance(share_reads, bool):
        raise ValueError(
            f"model_loader_extra_config 'share_reads' must be true or false, not {share_reads!r}"
        )
    options = {key: value for key, value in extra.items() if key in _OPTIONS}
    engine = {key: value for key, value in extra.items() if key in engine_keys}
    return weights, share_reads, options, engine


def current_device() -> str:
    import torch

    if torch.cuda.is_available():
        return f"cuda:{torch.cuda.current_device()}"
    return "cpu"


def load_device(device: Any) -> str:
    """Where this library puts the tensors for an engine loading onto `device` (a
    `torch.device` or its text): that GPU (`cuda` alone: the current one; ROCm's torch calls its
    GPUs `cuda` too), else host memory, as the engines' own loaders hand out host tensors for
    the model to copy onto other devices (`cpu`, `xpu`, `npu`, ...). None: the current GPU, or
    host memory where there is none."""
    import torch

    if device is None:
        return current_device()
    device = torch.device(device)
    if device.type != "cuda":
        return "cpu"
    index = torch.cuda.current_device() if device.index is None else device.index
    return f"cuda:{index}"


def stream(
    source: Any,
    device: str,
    options: Dict[str, Any],
    process_group: Any,
    on_report: Callable[[Dict[str, Any]], None],
) -> Iterator[Tuple[str, Any]]:
    """`(name, tensor)` for every tensor of `source`, each full and owning its memory, on
    `device`; `on_report` gets the load's report once every tensor was handed out."""
    extra = {} if process_group is None else {"process_group": process_group}
    with _load.stage(source, device, **options, **extra) as load:
        yield from load
        on_report(load.report())


def devices_group(coordinator: Any, device: str) -> Any:
    """The process group of an engine's group coordinator (vLLM's and SGLang's world group)
    that moves tensors of `device`."""
    _, gpu = _native._device(device)
    return coordinator.cpu_group if gpu is None else coordinator.device_group


def lazy_class(make: Callable[[], type], name: str, module: str) -> Callable[[str], Any]:
    """A module `__getattr__` giving the class `name` made by `make()` when first asked for: the
    loader classes subclass the engine's own, whose import must wait for the engine. The class
    is named `module.name`."""
    made: List[type] = []

    def __getattr__(attribute: str) -> Any:
        if attribute != name:
            raise AttributeError(f"module {module!r} has no attribute {attribute!r}")
        if not made:
            cls = make()
            cls.__qualname__ = name
            cls.__module__ = module
            made.append(cls)
        return made[0]

    return __getattr__


class EngineLoaderMixin:
    """The loader plumbing vLLM's and SGLang's loader classes share, mixed in before the
    engine's own `DefaultModelLoader`.

    The engine's default loader keeps everything but the bytes: which files (its
    `_prepare_weights`, asked as for its load format `safetensors`), its filters and checks,
    `load_weights`, the device. The loader class calls `_configure` from its `__init__`,
    supplies `_world_group_coordinator()`, and reads each weight source through `_read`.
    """

    load_config: Any
    weights: Optional[str]
    share_reads: bool
    options: Dict[str, Any]
    last_report: Optional[Dict[str, Any]]
    # Where the engine's load puts the model (`load_model` sets it), None before.
    _target: Optional[Any] = None
    # The model path the configured `weights` were given for, when known (see `_weights_for`).
    _weights_of: Optional[str] = None
    # The model's own path in the load being made, when the engine says (vLLM's
    # `get_all_weights`): the source at that path is the model's own.
    _own_path: Optional[str] = None
    # Model id -> the commit the engine's config of it was read at (`_pin`): its weights are
    # read at that commit, whatever its revision names by then.
    _pinned: Optional[Dict[str, str]] = None

    def _pin(self, model: str, model_config: Any) -> None:
        """Reads `model`'s weights at the commit the engine read its config at, when the
        engine's config says which (`transformers` records the commit of a config read from
        the Hub or its cache as `_commit_hash`): config and weights of one commit, even when
        the revision (`main`) moves between the two."""
        commit = getattr(getattr(model_config, "hf_config", None), "_commit_hash", None)
        if isinstance(commit, str) and _COMMIT.fullmatch(commit):
            self._pinned = {**(self._pinned or {}), model: commit.lower()}

    def _configure(
        self, load_config: Any, extra: Any = None, engine_keys: Tuple[str, ...] = ()
    ) -> Dict[str, Any]:
        """Reads the extra config (a `ValueError` for an unknown key or a bad value): `extra`
        when given, else the load config's. Returns the keys of `engine_keys` it held."""
        if extra is None:
            extra = getattr(load_config, "model_loader_extra_config", None)
        self.weights, self.share_reads, self.options, engine = parse_extra_config(
            extra, LOAD_FORMAT, engine_keys
        )
        self.last_report = None
        return engine

    @contextlib.contextmanager
    def _as_format(self, load_format: Any) -> Iterator[None]:
        """`self.load_config` reads `load_format` for the length of the block: the engine's
        file choice (`_prepare_weights`) knows its own formats only, and this loader chooses
        files as its format `safetensors` does."""
        own = self.load_config
        self.load_config = with_format(own, load_format)
        try:
            yield
        finally:
            self.load_config = own

    def _world_group_coordinator(self) -> Any:
        """The engine's world group coordinator (`get_world_group()`)."""
        raise NotImplementedError

    def _weights_for(self, model: str, own: bool) -> Optional[str]:
        """The configured `weights`, when they hold the weights of the source at `model`: the
        model's `own` source (not a secondary one), and, where the model path the weights were
        given for is known (`_weights_of`), that path. A reload from a new checkpoint (vLLM's
        `reload_weights(weights_path=...)`, SGLang's `update_weights_from_disk(path)`) reads
        the new path: the `weights` belong to the model it reloads away from, as vLLM says of
        its own `model_weights`."""
        if self.weights is None or not own:
            return None
        if self._weights_of is not None and model != self._weights_of:
            return None
        return self.weights

    def _streamed(
        self, model: str, revision: Optional[str], own: bool, plain: bool
    ) -> Optional[str]:
        """The URL this library reads a weight source from itself, or None (the engine's
        file choice picks local files): the `weights` URL (`_weights_for`), else, without
        `weights`, a Hub model id's `hf://{model}@{revision}` (streamed into the Hugging Face
        cache instead of being downloaded first). Only for a `plain` source, with no prefix,
        subfolder or file patterns of the model's: those go through the engine's file choice,
        and a `weights` URL cannot apply them (a `ValueError`)."""
        weights = self._weights_for(model, own)
        if is_url(weights):
            if not plain:
                raise ValueError(
                    f"the model's weights at {model!r} are chosen by a subfolder or file "
                    f"patterns of the model's, which the engine applies to local files only: "
                    f"give `weights` as a local directory, not the URL {weights!r}"
                )
            return weights
        if weights is None and plain:
            pinned = (self._pinned or {}).get(model) if own else None
            return hub_path(model, pinned or revision)
        return None

    def _model_dir(self, model: str, own: bool) -> str:
        """Where the engine's file choice looks for a source's files: the `weights` directory
        when it holds this source's weights (`_weights_for`), else the source's own path."""
        weights = self._weights_for(model, own)
        return weights if weights is not None and not is_url(weights) else model

    def _device(self) -> str:
        """Where the tensors go: `load_device` of the engine's target device (the one
        `load_model` was given), else of what the engine says now (`_engine_device`)."""
        return load_device(self._target if self._target is not None else self._engine_device())

    def _engine_device(self) -> Any:
        """The device the running engine loads onto, outside `load_model` (an in-place
        reload), or None (the current GPU, else host memory)."""
        return None

    def _read(
        self, source: Any, keep: Optional[Callable[[str], bool]] = None
    ) -> Iterator[Tuple[str, Any]]:
        """`(name, tensor)` of every tensor of `source` (files or a URL) that `keep` accepts
        (None: all), full, each owning its memory, on `_device()`; the report is kept in
        `last_report` once all were handed out. What `keep` refuses is never read."""
        device = self._device()
        options = self.options
        download_dir = getattr(self.load_config, "download_dir", None)
        if is_hub(source) and download_dir is not None and "cache_dir" not in options:
            # The engine's `--download-dir` is the Hugging Face cache its download would fill.
            options = {**options, "cache_dir": download_dir}
        if keep is not None:
            options = {**options, "select": keep}
        group = None
        if self.share_reads:
            group = devices_group(self._world_group_coordinator(), device)
        return stream(source, device, options, group, self._keep_report)

    def _keep_report(self, report: Dict[str, Any]) -> None:
        self.last_report = report


def with_format(load_config: Any, load_format: Any, extra: Any = None) -> Any:
    """A shallow copy of an engine's `load_config` with `load_format` (and, when given, the
    extra config `extra`), made without running the config's checks again."""
    twin = copy.copy(load_config)
    twin.load_format = load_format
    if extra is not None:
        twin.model_loader_extra_config = extra
    return twin
