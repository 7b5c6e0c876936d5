"""Stand-in for sglang.srt.configs.load_config.LoadConfig: the fields the loader reads."""
from dataclasses import dataclass, field
from typing import Any, Optional, Union


@dataclass
class LoadConfig:
    load_format: Any = "auto"
    download_dir: Optional[str] = None
    model_loader_extra_config: Union[dict, Any] = field(default_factory=dict)
    ignore_patterns: Optional[Union[list, str]] = None
    draft_model_idx: Optional[int] = None
