"""What the engine plugins share: the keys of a loader's extra config, the files a model
directory's weights are in (as vLLM's and SGLang's default loaders choose them), and the loader
plumbing itself (`EngineLoaderMixin`)."""

from __future__ import annotations

import fnmatch
import glob
import json
import os
import re
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple
from urllib.parse import quote

from . import _native

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

_INDEX = "model.safetensors.index.json"


def is_url(weights: Optional[str]) -> bool:
    """Whether `weights` is a URL, which the library reads itself, rather than a local
    directory: the library's answer."""
    return weights is not None and _native._is_url(weights)


# A repository name (or organization) as `huggingface_hub`'s `validate_repo_id` takes one, in
# the ASCII the library's `hf://` takes: 1 to 96 of A-Z a-z 0-9 _ - ., starting and ending with
# a letter, digit or `_`.
_REPO_NAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?")


def is_hub(path: Any) -> bool:
    """Whether `path` is a Hub path (`hf://...`)."""
    return isinstance(path, str) and path[:5].lower() == "hf://"


def is_repo_id(name: Any) -> bool:
    """Whether `name` is a Hub model id (`org/name` or `name`) by `huggingface_hub`'s rules:
    each part 1 to 96 of A-Z a-z 0-9 _ - ., not starting or ending with - or ., no -- or ..,
    not ending with .git."""
    if not isinstance(name, str) or name.count("/") > 1:
        return False
    return (
        all(_REPO_NAME.fullmatch(part) for part in name.split("/"))
        and "--" not in name
        and ".." not in name
        and not name.endswith(".git")
    )


def hub_path(model: Any, revision: Optional[str] = None) -> Optional[str]:
    """`hf://{model}@{revision}` when `model` names a model on the Hub rather than a local path:
    a model id that is not an existing path (as `transformers` and the engines tell them
    apart), or an `hf://` path already (returned as it is). `None` otherwise."""
    if is_hub(model):
        return model
    if not is_repo_id(model) or os.path.exists(model):
        return None
    # A revision holding `/` (`refs/pr/1`) is written percent-encoded.
    return f"hf://{model}@{quote(revision or 'main', safe='')}"


def parse_extra_config(extra: Any, load_format: str) -> Tuple[Optional[str], bool, Dict[str, Any]]:
    """`(weights, share_reads, options)` from `model_loader_extra_config`.

    Args:
        extra: the extra config: a dict, JSON text, or None.
        load_format: the load format named in errors.

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
    unknown = sorted(set(extra) - set(EXTRA_CONFIG_KEYS))
    if unknown:
        raise ValueError(
            f"unknown key(s) {', '.join(map(repr, unknown))} in model_loader_extra_config for load format "
            f"{load_format!r}; accepted: {', '.join(EXTRA_CONFIG_KEYS)}"
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
    return weights, share_reads, options


def weight_files(
    directory: str, ignore_patterns: Any = None, load_format: str = "staging"
) -> List[str]:
    """The safetensors files vLLM's default loader would read from a local directory.

    Its top-level `*.safetensors`, less those matching `ignore_patterns`, and, when an index is
    there, only the files it names (a repository with a consolidated copy beside the shards
    reads the shards once).

    Args:
        directory: a local model directory.
        ignore_patterns: a glob or a list of globs of file names to leave out.
        load_format: the load format named in the error.

    Returns:
        The files' paths, sorted.

    Raises:
        ValueError: no safetensors file is left.
    """
    if isinstance(ignore_patterns, str):
        ignore_patterns = [ignore_patterns]
    files = sorted(glob.glob(os.path.join(directory, "*.safetensors")))
    files = [
        f
        for f in files
        if not any(
            fnmatch.fnmatch(os.path.relpath(f, directory), pattern)
            for pattern in (ignore_patterns or [])
        )
    ]
    index = os.path.join(directory, _INDEX)
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            named = {
                os.path.join(directory, name)
                for name in json.load(f).get("weight_map", {}).values()
            }
        files = [f for f in files if f in named]
    if not files:
        raise ValueError(
            f"no safetensors weights in {directory} (load format {load_format!r} reads safetensors only)"
        )
    return files


def current_device() -> str:
    import torch

    if torch.cuda.is_available():
        return f"cuda:{torch.cuda.current_device()}"
    return "cpu"


def stream(
    source: Any,
    device: str,
    options: Dict[str, Any],
    process_group: Any,
    on_report: Callable[[Dict[str, Any]], None],
) -> Iterator[Tuple[str, Any]]:
    """`(name, tensor)` for every tensor of `source`, each full and owning its memory, on
    `device`; `on_report` gets the load's report once every tensor was handed out."""
    import safetensors_staging as st

    extra = {} if process_group is None else {"process_group": process_group}
    with st.stage(source, device, **options, **extra) as load:
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
    engine's own base class.

    The loader class calls `_configure(load_config)` from its `__init__` and supplies the
    engine's `_download_weights_from_hf()` and `_world_group_coordinator()`; it then builds its
    engine's methods from `_prepare_download` and `_staged_weights`.
    """

    load_config: Any
    weights: Optional[str]
    share_reads: bool
    options: Dict[str, Any]
    last_report: Optional[Dict[str, Any]]

    def _configure(self, load_config: Any, extra: Any = None) -> None:
        """Reads the extra config (a `ValueError` for an unknown key or a bad value): `extra`
        when given, else the load config's."""
        if extra is None:
            extra = getattr(load_config, "model_loader_extra_config", None)
        self.weights, self.share_reads, self.options = parse_extra_config(extra, LOAD_FORMAT)
        self.last_report = None

    def _download_weights_from_hf(self) -> Callable[..., str]:
        """The engine's `download_weights_from_hf`."""
        raise NotImplementedError

    def _world_group_coordinator(self) -> Any:
        """The engine's world group coordinator (`get_world_group()`)."""
        raise NotImplementedError

    def _local_dir(self, model: str, revision: Optional[str]) -> str:
        """The local directory of the weights: `weights` when a directory, the model's when
        one, else the model downloaded from the hub (safetensors files only)."""
        if self.weights is not None and not is_url(self.weights):
            return self.weights
        if os.path.isdir(model):
            return model
        return self._download_weights_from_hf()(
            model,
            self.load_config.download_dir,
            ["*.safetensors"],
            revision,
            ignore_patterns=self.load_config.ignore_patterns,
        )

    def _hub_source(self, model: str, revision: Optional[str]) -> Optional[str]:
        """`hf://{model}@{revision}` when no `weights` is given and `model` is a Hub model id,
        not a local directory: its weights stream from the Hub (into the Hugging Face cache)
        instead of being downloaded first."""
        return hub_path(model, revision) if self.weights is None else None

    def _prepare_download(self, model: str, revision: Optional[str]) -> None:
        """What the engine's `download_model` does: fetch the weights unless they are a URL or
        a Hub model's (which the library reads itself)."""
        if not is_url(self.weights) and self._hub_source(model, revision) is None:
            self._local_dir(model, revision)

    def _staged_weights(
        self, model: str, revision: Optional[str], url_applies: bool = True
    ) -> Iterator[Tuple[str, Any]]:
        """`(name, tensor)` of every tensor of the model's weights, full, each owning its
        memory, on the engine's current device; the report is kept in `last_report` once all
        were handed out. The files are chosen now, the tensors read as they are asked for.

        Args:
            model: the model's directory or Hub model id (read through `hf://` when no
                `weights` is given; `ignore_patterns` do not apply there: the library picks
                the index, else `model.safetensors`, else every `*.safetensors` at the root).
            revision: its Hub revision (`main` when None).
            url_applies: whether a `weights` URL holds these weights (not for SGLang's
                secondary weights, which come with a prefix).
        """
        device = current_device()
        hub = self._hub_source(model, revision)
        if url_applies and is_url(self.weights):
            source: Any = self.weights
        elif hub is not None:
            source = hub
        else:
            source = weight_files(
                self._local_dir(model, revision), self.load_config.ignore_patterns, LOAD_FORMAT
            )
        options = self.options
        download_dir = getattr(self.load_config, "download_dir", None)
        if is_hub(source) and download_dir is not None and "cache_dir" not in options:
            # The engine's `--download-dir` is the Hugging Face cache its download would fill.
            options = {**options, "cache_dir": download_dir}
        group = None
        if self.share_reads:
            group = devices_group(self._world_group_coordinator(), device)
        return stream(source, device, options, group, self._keep_report)

    def _keep_report(self, report: Dict[str, Any]) -> None:
        self.last_report = report
