"""Stand-in for sglang.srt.model_executor.model_runner_components.weight_updater: the part of
`WeightUpdater.update_weights_from_disk` (SGLang 0.5.23) a loader meets. A `LoadConfig` made from
the load format alone, the loader `get_model_loader` gives for it (a `DefaultModelLoader`, or the
update fails), its `_get_weights_iterator` over `DefaultModelLoader.Source.init_new(config,
model)`, and `load_weights_and_postprocess` into the running model; a failure is an answer
`(False, message)`, after loading again from the same source (SGLang's roll back). Memory
checks, CUDA graphs and the distributed groups of the real one are left out."""

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from sglang.srt.configs.load_config import LoadConfig
from sglang.srt.model_loader.loader import DefaultModelLoader, get_model_loader


@dataclass(frozen=True)
class WeightUpdater:
    tp_rank: int
    device: str
    gpu_id: int
    model_config: Any
    custom_weight_loaders: dict
    get_model: Callable[[], Any]
    update_model_fields: Callable[..., None]
    recapture_cuda_graph: Callable[[], None]
    get_model_runner: Callable[[], Any]

    def update_weights_from_disk(
        self,
        model_path: str,
        load_format: str,
        weight_name_filter: Optional[Callable[[str], bool]] = None,
        recapture_cuda_graph: bool = False,
    ):
        target_device = torch.device(self.device)
        self.model_config.model_path = model_path
        load_config = LoadConfig(load_format=load_format)
        loader = get_model_loader(load_config, self.model_config)
        if not isinstance(loader, DefaultModelLoader):
            return False, f"Failed to get model loader: {loader}."

        def get_weight_iter(config):
            weights = loader._get_weights_iterator(
                DefaultModelLoader.Source.init_new(config, self.get_model())
            )
            if weight_name_filter is not None:
                weights = ((n, w) for n, w in weights if weight_name_filter(n))
            return weights

        try:
            weights = get_weight_iter(self.model_config)
        except Exception as e:
            return False, f"Failed to get weights iterator: {e}."
        try:
            loader.load_weights_and_postprocess(self.get_model(), weights, target_device)
        except Exception as e:
            message = f"Failed to update weights: {e}.\nRolling back to original weights."
            del weights
            loader.load_weights_and_postprocess(
                self.get_model(), get_weight_iter(self.model_config), target_device
            )
            return False, message
        self.update_model_fields(
            self.get_model(),
            model_path=model_path,
            load_format=load_format,
            load_config=load_config,
        )
        return True, "Succeeded to update model weights."
