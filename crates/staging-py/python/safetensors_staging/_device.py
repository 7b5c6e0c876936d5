"""Device spellings as the library reads them, and torch's device for a GPU ordinal."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Optional, Tuple

from . import _native

if TYPE_CHECKING:
    import torch


def resolve_device(device: Any) -> Tuple[str, Optional[int]]:
    """A device as the library reads it, and its GPU ordinal.

    Args:
        device: "cpu", "auto", "cuda", "cuda:N", "hip:N", an int or a `torch.device`.

    Returns:
        The library's spelling and the GPU ordinal (None for "cpu" and "auto").

    Raises:
        InvalidOptionError: the library does not read this spelling.
    """
    # Only "cuda" alone is resolved here, to torch's current CUDA device, which the library
    # cannot see.
    if str(device) == "cuda":
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            device = int(torch.cuda.current_device())
    spelled, gpu = _native._device(device)
    return spelled, gpu


def torch_device(gpu: Optional[int]) -> torch.device:
    """Torch's device for a GPU ordinal (torch calls ROCm GPUs "cuda" too), or the CPU."""
    import torch

    return torch.device("cpu") if gpu is None else torch.device("cuda", gpu)
