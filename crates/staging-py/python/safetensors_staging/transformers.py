"""`transformers` models with their weights read by this library.

```python
from safetensors_staging.transformers import from_pretrained

model = from_pretrained("Qwen/Qwen2.5-0.5B-snapshot-dir", AutoModelForCausalLM, device="cuda:0")
model = from_pretrained("Qwen/Qwen2.5-0.5B", AutoModelForCausalLM, device="cuda:0")  # the Hub
```

A model id (`org/name`, as `transformers` takes one: not an existing local path) or an
`hf://org/name[@revision][/path]` path is read from the Hugging Face Hub through `hf://`: the
weights stream onto the device while they are written into the Hugging Face cache, as
`huggingface_hub` writes it, and the config is read from the snapshot that leaves there (with
`cache=False`, nothing is written and the config comes from `transformers.AutoConfig`).

`transformers` has no loader hook, but `from_pretrained(None, config=..., state_dict=...)` takes
a state dict and still applies its key renames, dtype, `device_map` and tensor-parallel plan.
This hands it one lazy slice (`safe_open(...).get_slice(name)`, with `get_shape()`,
`get_dtype()` and `[...]`) per tensor, as its own loader does with `safetensors`: each weight is
read when `transformers` materializes it, and where it shards a weight for tensor parallelism it
indexes the slice, so a rank reads only the rows of its share. Nothing here imports
`transformers` before `from_pretrained` is called.

Where the handle reads rather than maps (a model streamed from the Hub or a URL, weights read
onto a GPU) and no tensor-parallel plan is given, the weights are read in file order on a
thread of their own from the moment the checkpoint is open, while `transformers` imports the
model's module and builds it (a second or two), and each slice hands out the tensor read for
it; at most `_AHEAD_BYTES` are held before `transformers` takes them.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Dict, List, Optional, Set

from . import _device, _engines
from ._load import gc_paused
from ._native import _DTYPES
from ._safe_open import safe_open

# Bytes of tensors read ahead and not yet taken by `transformers`, at most: a bound on what a
# load holds beyond the model (tensors of names the model ignores, tensors `transformers`
# converts to another dtype), whatever the model's size.
_AHEAD_BYTES = 2 << 30


class _ReadAhead:
    """Every tensor of `handle`, in file order, read on a thread of its own while the model is
    being built, by loads of up to `_AHEAD_BYTES / 2` each; `take(name)` hands out the tensor
    read for `name` (waiting for it when it is being read or comes later in file order), or
    None when the caller should read it itself:
    one not read yet while the thread waits for room (the tensors it holds may be ones nobody
    asks for), one asked for twice, one after the thread stopped on an error (the caller's own
    read then says what failed, for its tensor). A tensor a caller reads is not read here."""

    def __init__(self, handle: safe_open) -> None:
        self._handle = handle
        self._names = handle.offset_keys()
        self._sizes = {info.name: info.nbytes for info in handle._checkpoint.tensors()}
        self._cond = threading.Condition()
        self._read: Dict[str, Any] = {}  # read, not yet taken
        self._skip: Set[str] = set()  # taken by a caller's own read: not read here
        self._next = 0  # position of the first tensor of the load under way (or the next)
        self._held = 0
        self._waiting_for_room = False
        self._stopped = False
        self._thread = threading.Thread(
            target=self._run, name="from_pretrained-read-ahead", daemon=True
        )

    def start(self) -> bool:
        """Starts the thread; False when none can be started (a limit on threads): the slices
        then read for themselves, as without a read ahead."""
        try:
            self._thread.start()
        except RuntimeError:
            with self._cond:
                self._stopped = True
            return False
        return True

    def _run(self) -> None:
        try:
            self._read_groups()
        finally:
            # However the thread ends (done, a failure, a close), no caller waits for it.
            with self._cond:
                self._stopped = True
                self._cond.notify_all()

    def _read_groups(self) -> None:
        while True:
            with self._cond:
                group = self._group()
                if self._stopped or not group:
                    return
                need = sum(self._sizes[name] for name in group)
                if self._held and self._held + need > _AHEAD_BYTES:
                    self._waiting_for_room = True
                    self._cond.notify_all()  # a caller waiting out of turn reads for itself
                    self._cond.wait()
                    self._waiting_for_room = False
                    continue
                end = self._handle._position[group[-1]] + 1
            try:
                # One load of the group, as `stage` reads (its I/O threads, its reads across
                # tensors), not a load per tensor.
                for name, tensor in self._handle._stream(group):
                    with self._cond:
                        if self._stopped:
                            return
                        self._read[name] = tensor
                        self._held += self._sizes[name]
                        self._cond.notify_all()
            except BaseException:
                # Any failure (a read, a close): the callers read for themselves, and their
                # reads raise what is wrong, naming their tensor.
                return
            with self._cond:
                self._next = end
                self._cond.notify_all()

    def _group(self) -> List[str]:
        """The tensors read by the next load: from `_next` on, those no caller read itself, up
        to half of `_AHEAD_BYTES` (one at least)."""
        group: List[str] = []
        total = 0
        for name in self._names[self._next :]:
            if name in self._skip:
                continue
            if group and total + self._sizes[name] > _AHEAD_BYTES // 2:
                break
            group.append(name)
            total += self._sizes[name]
        return group

    def take(self, name: str) -> Any:
        with self._cond:
            while True:
                if name in self._read:
                    self._held -= self._sizes[name]
                    self._cond.notify_all()
                    return self._read.pop(name)
                position = self._handle._position.get(name)
                coming = (
                    not self._stopped
                    and position is not None
                    and position >= self._next
                    and not self._waiting_for_room
                    and name not in self._skip
                )
                if not coming:
                    self._skip.add(name)
                    self._cond.notify_all()  # a group waiting for room may fit now
                    return None
                self._cond.wait()

    def stop(self) -> None:
        """Ends the reads ahead (one under way ends with the handle's close) and drops what
        was not taken."""
        with self._cond:
            self._stopped = True
            self._read.clear()
            self._held = 0
            self._cond.notify_all()

    def join(self) -> None:
        if self._thread.ident is not None:  # started
            self._thread.join()


class _AheadSlice:
    """A lazy slice (`get_shape`, `get_dtype`, `[...]`) whose whole tensor comes from the read
    ahead; any other index reads what it needs through the handle's own slice."""

    def __init__(self, ahead: _ReadAhead, inner: Any, name: str) -> None:
        self._ahead = ahead
        self._inner = inner
        self._name = name

    def get_shape(self) -> List[int]:
        return list(self._inner.get_shape())

    def get_dtype(self) -> str:
        return str(self._inner.get_dtype())

    def __getitem__(self, key: Any) -> Any:
        if key is Ellipsis or (isinstance(key, slice) and key == slice(None)):
            tensor = self._ahead.take(self._name)
            if tensor is not None:
                return tensor
        return self._inner[key]

    def __repr__(self) -> str:
        return f"_AheadSlice({self._name!r})"


def _config_dir(path: Any) -> Path:
    """The directory holding `config.json`: `path` itself, or the directory of a file or
    index given."""
    local = Path(os.fspath(path))
    return local if local.is_dir() else local.parent


def _hub_config(handle: safe_open, cache_dir: Any) -> Any:
    """The config of the Hub model `handle` has just opened, at the commit the library resolved
    its revision to (the load report's `hub`, the one answer to which commit): from that
    commit's snapshot in the cache, or, with the cache off, from `transformers.AutoConfig` at
    that commit. Never from what `refs/<revision>` names a moment later."""
    import transformers

    hub = handle.report()["hub"]
    inside = hub["path"]
    # A path inside the repository names a directory, an index or a weight file.
    subfolder = inside.rpartition("/")[0] if inside.endswith((".json", ".safetensors")) else inside
    if hub["snapshot"] is not None:
        return transformers.AutoConfig.from_pretrained(Path(hub["snapshot"]) / subfolder)
    kwargs: Dict[str, Any] = {"revision": hub["commit"]}
    if subfolder:
        kwargs["subfolder"] = subfolder
    if cache_dir is not None:
        kwargs["cache_dir"] = os.fspath(cache_dir)
    return transformers.AutoConfig.from_pretrained(hub["repo"], **kwargs)


def _dtype_of(handle: safe_open, config: Any) -> Any:
    """`dtype="auto"` resolved as `transformers` resolves it (the config's, else the first
    floating tensor's), without reading a tensor: `transformers` would ask the lazy slices for a
    `dtype` they do not have."""
    import torch

    configured = getattr(config, "dtype", None)
    if configured is not None:
        return getattr(torch, configured) if isinstance(configured, str) else configured
    for name in handle.offset_keys():
        facts = _DTYPES[handle.get_slice(name).get_dtype()]
        floating = getattr(torch, facts.torch) if facts.torch else None
        # A model is built in a float of 16 bits or more; float8 weights are quantized ones.
        if floating is not None and floating.is_floating_point and facts.bits >= 16:
            return floating
    return torch.float32


def from_pretrained(
    path: Any,
    model_class: Any = None,
    device: Any = "cpu",
    *,
    config: Any = None,
    model_kwargs: Optional[Dict[str, Any]] = None,
    revision: Optional[str] = None,
    **loader_options: Any,
) -> Any:
    """A `transformers` model: its config from `path`, its weights read through this library.

    Args:
        path: a local model directory (`config.json` and the safetensors files, sharded or
            not, a hub-cache snapshot); a model id on the Hugging Face Hub (`org/name` that
            is not a local path) or an `hf://org/name[@revision][/path]` path, read through
            `hf://` (the config from the snapshot the load leaves in the cache); or, with
            `config=` given, anything `safe_open` takes (a URL too).
        model_class: the `transformers` class to build (`AutoModel` by default), e.g.
            `AutoModelForCausalLM`.
        device: where the weights go (`"cpu"`, `"cuda:N"`, ...): the model is built there
            (`device_map={"": device}` unless `model_kwargs` gives a `device_map` or
            `tp_plan`), and the weights are read straight onto it through the GPU backends.
        config: a config to use instead of the one in `path`.
        model_kwargs: further keywords for `model_class.from_pretrained` (`dtype`, `tp_plan`,
            `attn_implementation`, ...). `dtype` defaults to "auto": the config's, else the
            first floating tensor's of 16 bits or more.
        revision: the Hub revision of a model id (a branch, tag or commit; `main` when None).
        **loader_options: this library's options (`backend`, `memory_cap`, `chunk_size`,
            remote options, ...), as for `load_file`.

    Where the weights are read rather than mapped (the Hub, a URL, a GPU) and no `tp_plan` is
    given, they are read on a thread of their own while the model is built (at most 2 GiB
    held before `transformers` takes them), and Python's cyclic garbage collector is paused
    until this returns (see the module's docs).

    Returns:
        The model, built by `model_class.from_pretrained(None, config=..., state_dict=...)`.

    Raises:
        ValueError: an `Auto...` class with no model class for the config; a `revision=`
            beside an `hf://` path (which says its own).
    """
    import transformers

    if model_class is None:
        model_class = transformers.AutoModel
    kwargs = dict(model_kwargs or {})
    hub = _engines.hub_path(path, revision) if isinstance(path, str) else None
    if hub is not None and revision is not None and _engines.is_hub(path):
        raise ValueError(
            f"revision={revision!r} given beside {path!r}: write it in the path (hf://org/name@rev)"
        )
    if config is None and hub is None:
        config = transformers.AutoConfig.from_pretrained(_config_dir(path))
    with safe_open(hub or path, framework="pt", device=device, **loader_options) as handle:
        ahead = None
        if not handle._mapped and "tp_plan" not in kwargs:
            ahead = _ReadAhead(handle)
        # Python's cyclic garbage collector is paused while the model is built, and restored
        # after: its full collections scan every object torch and transformers have made (a
        # million and more), again and again while the model's module is imported and its
        # tensors are handed out: 0.5 s of a 1 GiB model's 4.5 s on a 2-core VM (2026-12-06),
        # on the core the reads ahead share. Cycles made meanwhile are collected after.
        # Paused only where no other thread runs (`gc_paused`), asked before the read-ahead
        # thread, the helper's own, starts.
        with gc_paused():
            try:
                if ahead is not None and not ahead.start():
                    ahead = None
                return _build(handle, ahead, model_class, config, kwargs, device, loader_options)
            finally:
                if ahead is not None:
                    ahead.stop()
                    handle.close()  # a read under way ends now
                    ahead.join()


def _build(
    handle: safe_open,
    ahead: Optional[_ReadAhead],
    model_class: Any,
    config: Any,
    kwargs: Dict[str, Any],
    device: Any,
    loader_options: Dict[str, Any],
) -> Any:
    """The model, from an open handle: what `from_pretrained` does once the checkpoint is
    open (and, with `ahead`, its tensors are being read)."""
    if config is None:
        # Opening a Hub model fetched its config into the cache (unless `cache=False`),
        # at the commit its weights are read at.
        config = _hub_config(handle, loader_options.get("cache_dir"))
    # An `Auto...` class cannot be given a state dict without a path: the class it
    # stands for.
    mapping = getattr(model_class, "_model_mapping", None)
    if mapping is not None:
        try:
            model_class = mapping[type(config)]
        except KeyError:
            raise ValueError(
                f"{model_class.__name__} has no model class for {type(config).__name__}"
            ) from None
    state_dict: Dict[str, Any] = {name: handle.get_slice(name) for name in handle.offset_keys()}
    if ahead is not None:
        state_dict = {name: _AheadSlice(ahead, s, name) for name, s in state_dict.items()}
    if kwargs.get("dtype", "auto") == "auto" and "torch_dtype" not in kwargs:
        kwargs["dtype"] = _dtype_of(handle, config)
    _, gpu = _device.resolve_device(device)
    if "device_map" not in kwargs and "tp_plan" not in kwargs and gpu is not None:
        kwargs["device_map"] = {"": _device.torch_device(gpu)}
    return model_class.from_pretrained(None, config=config, state_dict=state_dict, **kwargs)
