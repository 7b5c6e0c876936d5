"""`transformers` models with their weights read by this library.

```python
from safetensors_staging.transformers import from_pretrained

model = from_pretrained("Qwen/Qwen2.5-0.5B-snapshot-dir", AutoModelForCausalLM, device="cuda:0")
```

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

from . import _device
from ._native import _DTYPES
from ._safe_open import safe_open


def _config_dir(path: Any) -> Path:
    """The directory holding `config.json`: `path` itself, or the directory of a file or
    index given."""
    local = Path(os.fspath(path))
    return local if local.is_dir() else local.parent


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
    **loader_options: Any,
) -> Any:
    """A `transformers` model: its config from `path`, its weights read through this library.

    Args:
        path: a local model directory (`config.json` and the safetensors files, sharded or
            not, a hub-cache snapshot); or, with `config=` given, anything `safe_open` takes
            (a URL too).
        model_class: the `transformers` class to build (`AutoModel` by default), e.g.
            `AutoModelForCausalLM`.
        device: where the weights go (`"cpu"`, `"cuda:N"`, ...): the model is built there
            (`device_map={"": device}` unless `model_kwargs` gives a `device_map` or
            `tp_plan`), and the weights are read straight onto it through the GPU backends.
        config: a config to use instead of the one in `path`.
        model_kwargs: further keywords for `model_class.from_pretrained` (`dtype`, `tp_plan`,
            `attn_implementation`, ...). `dtype` defaults to "auto": the config's, else the
            first floating tensor's of 16 bits or more.
        **loader_options: this library's options (`backend`, `memory_cap`, `chunk_size`,
            remote options, ...), as for `load_file`.

    Returns:
        The model, built by `model_class.from_pretrained(None, config=..., state_dict=...)`.

    Raises:
        ValueError: an `Auto...` class with no model class for the config.
    """
    import transformers

    if model_class is None:
        model_class = transformers.AutoModel
    kwargs = dict(model_kwargs or {})
    if config is None:
        config = transformers.AutoConfig.from_pretrained(_config_dir(path))
    # An `Auto...` class cannot be given a state dict without a path: the class it stands for.
    mapping = getattr(model_class, "_model_mapping", None)
    if mapping is not None:
        try:
            model_class = mapping[type(config)]
        except KeyError:
            raise ValueError(
                f"{model_class.__name__} has no model class for {type(config).__name__}"
            ) from None
    with safe_open(path, framework="pt", device=device, **loader_options) as handle:
        state_dict = {name: handle.get_slice(name) for name in handle.offset_keys()}
        if kwargs.get("dtype", "auto") == "auto" and "torch_dtype" not in kwargs:
            kwargs["dtype"] = _dtype_of(handle, config)
        _, gpu = _device.resolve_device(device)
        if "device_map" not in kwargs and "tp_plan" not in kwargs and gpu is not None:
            kwargs["device_map"] = {"": _device.torch_device(gpu)}
        return model_class.from_pretrained(None, config=config, state_dict=state_dict, **kwargs)
