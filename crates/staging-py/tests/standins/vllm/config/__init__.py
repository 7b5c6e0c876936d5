"""Stand-in for vllm.config: the load config, and the current `VllmConfig` (None until a test
sets it with `set_current_vllm_config`; the real one is set by the engine around model loading)."""

from dataclasses import dataclass, field
from typing import Any, Optional

from vllm.config.load import LoadConfig  # noqa: F401

_current = None


@dataclass
class DeviceConfig:
    device: Any = "cpu"


@dataclass
class ParallelConfig:
    enable_expert_parallel: bool = False
    enable_ep_weight_filter: bool = True
    enable_eplb: bool = False
    # Stand-in: the local experts the real one computes from the EP rank and size.
    local_expert_ids: Optional[set] = None


@dataclass
class VllmConfig:
    load_config: Any = field(default_factory=LoadConfig)
    device_config: Any = field(default_factory=DeviceConfig)
    parallel_config: Any = field(default_factory=ParallelConfig)


def get_current_vllm_config_or_none():
    return _current


def get_current_vllm_config():
    return _current if _current is not None else VllmConfig()


def set_current_vllm_config(config):
    global _current
    _current = config
