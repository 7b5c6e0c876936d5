"""Stand-in for vllm.config.load.LoadConfig: the fields the loaders read."""

from dataclasses import dataclass, field
from typing import Any, Optional, Union


@dataclass
class LoadConfig:
    load_format: str = "auto"
    download_dir: Optional[str] = None
    safetensors_load_strategy: Optional[str] = None
    model_loader_extra_config: Union[dict, Any] = field(default_factory=dict)
    device: Optional[str] = None
    ignore_patterns: Union[list, str] = field(default_factory=lambda: ["original/**/*"])
    use_tqdm_on_load: bool = True
