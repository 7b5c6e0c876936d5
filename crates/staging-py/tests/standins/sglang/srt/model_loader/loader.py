"""Stand-in for sglang.srt.model_loader.loader: the base classes, the default loader's load
flow (build the model on the target device, `model.load_weights(weights)`) and
`get_model_loader`'s use of a class given as `load_format`."""

import dataclasses
import re
from abc import ABC, abstractmethod
from typing import Optional

import torch


def get_model_architecture(model_config):
    # Stand-in: the test's model config names its class.
    return model_config.model_class, model_config.model_class.__name__


def _initialize_model(model_config, load_config, quant_config=None):
    model_class, _ = get_model_architecture(model_config)
    return model_class(config=model_config.hf_config, quant_config=quant_config)


class BaseModelLoader(ABC):
    def __init__(self, load_config):
        self.load_config = load_config

    @abstractmethod
    def download_model(self, model_config) -> None:
        raise NotImplementedError

    @abstractmethod
    def load_model(self, *, model_config, device_config):
        raise NotImplementedError


class DefaultModelLoader(BaseModelLoader):
    _MTP_PATTERN = re.compile(r"model\.mtp\.layers\.(\d+)\.")

    @dataclasses.dataclass
    class Source:
        model_or_path: str
        revision: Optional[str]
        prefix: str = ""
        fall_back_to_pt: bool = True
        model_config: Optional[object] = None

        @classmethod
        def init_new(cls, model_config, model):
            return cls(
                model_config.model_path,
                model_config.revision,
                prefix="",
                fall_back_to_pt=getattr(model, "fall_back_to_pt_during_load", True),
                model_config=model_config,
            )

    def __init__(self, load_config):
        super().__init__(load_config)
        unexpected = set(load_config.model_loader_extra_config) - {
            "enable_multithread_load",
            "num_threads",
        }
        if unexpected:
            raise ValueError(
                f"Unexpected extra config keys for load format {load_config.load_format}: {unexpected}"
            )

    def _get_weights_iterator(self, source):
        raise NotImplementedError("stand-in: the default loader reads with safetensors")

    @classmethod
    def _filter_mtp_weights(cls, weights_iterator, prefix, draft_model_idx):
        out = []
        for name, tensor in weights_iterator:
            match = cls._MTP_PATTERN.match(name)
            if match is not None:
                if int(match.group(1)) != draft_model_idx:
                    continue
                name = name.replace(match.group(), "model.mtp.layers.0.")
            out.append((prefix + name, tensor))
        return tuple(out)

    def _get_all_weights(self, model_config, model):
        yield from self._get_weights_iterator(
            DefaultModelLoader.Source.init_new(model_config, model)
        )
        for source in getattr(model, "secondary_weights", ()):
            yield from self._get_weights_iterator(source)

    def download_model(self, model_config) -> None:
        raise NotImplementedError("stand-in")

    def load_model(self, *, model_config, device_config):
        target_device = torch.device(device_config.device)
        with target_device:
            model = _initialize_model(model_config, self.load_config, None)
        self.load_weights_and_postprocess(
            model, self._get_all_weights(model_config, model), target_device
        )
        return model.eval()

    @staticmethod
    def load_weights_and_postprocess(model, weights, target_device):
        model.load_weights(weights)


def get_model_loader(load_config, model_config=None):
    if isinstance(load_config.load_format, type):
        return load_config.load_format(load_config)
    raise ValueError(f"stand-in: only a loader class, not {load_config.load_format!r}")
