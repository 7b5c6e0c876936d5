"""Stand-in for sglang.srt.configs.load_config: the fields the loader reads, and the check that
turns a format string into `LoadFormat` (refusing any other string) and leaves a class alone."""

import enum
from dataclasses import dataclass, field
from typing import Any, Optional, Union


class LoadFormat(str, enum.Enum):
    AUTO = "auto"
    SAFETENSORS = "safetensors"
    DUMMY = "dummy"


@dataclass
class LoadConfig:
    load_format: Any = LoadFormat.AUTO
    download_dir: Optional[str] = None
    model_loader_extra_config: Union[dict, Any] = field(default_factory=dict)
    ignore_patterns: Optional[Union[list, str]] = None
    draft_model_idx: Optional[int] = None
    modelopt_config: Optional[Any] = None

    def __post_init__(self):
        self._verify_load_format()

    def _verify_load_format(self) -> None:
        if not isinstance(self.load_format, str):
            return
        self.load_format = LoadFormat(self.load_format.lower())
