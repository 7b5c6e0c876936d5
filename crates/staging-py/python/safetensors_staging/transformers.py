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
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, Optional

from . import _device, _engines
from ._native import _DTYPES
from ._safe_open import safe_open


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
        state_dict = {name: handle.get_slice(name) for name in handle.offset_keys()}
        if kwargs.get("dtype", "auto") == "auto" and "torch_dtype" not in kwargs:
            kwargs["dtype"] = _dtype_of(handle, config)
        _, gpu = _device.resolve_device(device)
        if "device_map" not in kwargs and "tp_plan" not in kwargs and gpu is not None:
            kwargs["device_map"] = {"": _device.torch_device(gpu)}
        return model_class.from_pretrained(None, config=config, state_dict=state_dict, **kwargs)
