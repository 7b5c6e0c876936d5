"""Stand-in for vllm.model_executor.model_loader.base_loader: the abstract loader and vLLM
0.33's `load_model` flow, shortened: the model built on the load device (`load_config.device`,
else `device_config.device`), `load_weights`, then the word embeddings re-tied when the config
untied them for a checkpoint's `lm_head` equal to the embeddings (vLLM's
`maybe_retie_word_embeddings`, by the stand-in model's `embed`/`lm_head`). Stand-in: the model
config names the model class (`model_class`)."""

from abc import ABC, abstractmethod

import torch


class BaseModelLoader(ABC):
    def __init__(self, load_config):
        self.load_config = load_config

    @abstractmethod
    def download_model(self, model_config) -> None:
        raise NotImplementedError

    @abstractmethod
    def load_weights(self, model, model_config) -> None:
        raise NotImplementedError

    def load_model(self, vllm_config, model_config, prefix=""):
        device_config = vllm_config.device_config
        load_config = vllm_config.load_config
        load_device = device_config.device if load_config.device is None else load_config.device
        target_device = torch.device(load_device)
        with target_device:
            model = model_config.model_class(model_config.hf_config)
        self.load_weights(model, model_config)
        if getattr(model_config, "word_embeddings_untied_by_checkpoint", False) and torch.equal(
            model.lm_head.weight, model.embed.weight
        ):
            model.lm_head.weight = model.embed.weight
        return model.eval()
