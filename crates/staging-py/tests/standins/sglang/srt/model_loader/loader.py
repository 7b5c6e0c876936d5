"""Stand-in for sglang.srt.model_loader.loader (SGLang 0.5.23, shortened): the base classes, the
default loader's file choice, weight iterator and load flow (build the model on the target
device, `model.load_weights(weights)`), and `get_model_loader`'s use of a class given as
`load_format` (and of `safetensors`, for comparing with)."""

import dataclasses
import glob
import os
import re
import time
from abc import ABC, abstractmethod
from typing import Optional

import torch
from sglang.srt import runtime_context
from sglang.srt.configs.load_config import LoadFormat
from sglang.srt.model_loader import weight_utils


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
    DEFAULT_NUM_THREADS = 8
    _MTP_PATTERN = re.compile(r"model\.mtp\.layers\.(\d+)\.")

    @dataclasses.dataclass
    class Source:
        model_or_path: str
        revision: Optional[str]
        prefix: str = ""
        fall_back_to_pt: bool = True
        allow_patterns_overrides: Optional[list] = None
        model_config: Optional[object] = None

        @classmethod
        def init_new(cls, model_config, model):
            return cls(
                model_config.model_path,
                model_config.revision,
                prefix="",
                fall_back_to_pt=getattr(model, "fall_back_to_pt_during_load", True),
                allow_patterns_overrides=getattr(model, "allow_patterns_overrides", None),
                model_config=model_config,
            )

    @dataclasses.dataclass(frozen=True)
    class ResolvedSource:
        source: "DefaultModelLoader.Source"
        hf_folder: str
        weight_files: tuple
        use_safetensors: bool

    counter_before_loading_weights: float = 0.0
    counter_after_loading_weights: float = 0.0

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

    def _prepare_weights(
        self, model_name_or_path, revision, fall_back_to_pt, allow_patterns_overrides=None
    ):
        # SGLang 0.5.23's file choice, shortened: safetensors only, the index's files,
        # `--model-checksum` (the stand-in server args' `model_checksum`, verified by
        # `weight_utils.verify`), and the sort of SGLANG_SORT_WEIGHT_FILES (default 0: sorted;
        # -1: as globbed).
        is_local = os.path.isdir(model_name_or_path)
        if self.load_config.load_format != LoadFormat.SAFETENSORS:
            raise ValueError(f"Unknown load_format: {self.load_config.load_format}")
        allow_patterns = ["*.safetensors"]
        if fall_back_to_pt:
            allow_patterns += ["*.pt"]
        if allow_patterns_overrides is not None:
            allow_patterns = allow_patterns_overrides
        if not is_local:
            hf_folder = weight_utils.download_weights_from_hf(
                model_name_or_path,
                self.load_config.download_dir,
                allow_patterns,
                revision,
                ignore_patterns=self.load_config.ignore_patterns,
            )
        else:
            hf_folder = model_name_or_path
        server_args = runtime_context.get_server_args()
        if server_args is not None and getattr(server_args, "model_checksum", None) is not None:
            weight_utils.verify(model_path=hf_folder, checksums_source=server_args.model_checksum)
        hf_weights_files = []
        for pattern in allow_patterns:
            hf_weights_files += glob.glob(os.path.join(hf_folder, pattern))
            if hf_weights_files:
                break
        hf_weights_files = weight_utils.filter_duplicate_safetensors_files(
            hf_weights_files, hf_folder, "model.safetensors.index.json"
        )
        if not hf_weights_files:
            raise RuntimeError(f"Cannot find any model weights with `{model_name_or_path}`")
        if int(os.environ.get("SGLANG_SORT_WEIGHT_FILES", "0")) >= 0:
            hf_weights_files.sort()
        return hf_folder, hf_weights_files, True

    def _get_weights_iterator(
        self,
        source,
        *,
        resolved_source=None,
        startup_prefetch_started=False,
        startup_prefetch_active=False,
    ):
        if resolved_source is None:
            hf_folder, files, use_safetensors = self._prepare_weights(
                source.model_or_path,
                source.revision,
                source.fall_back_to_pt,
                source.allow_patterns_overrides,
            )
            if use_safetensors and source.model_config is not None:
                files = weight_utils.maybe_add_mtp_safetensors(
                    files, hf_folder, "model.safetensors.index.json", source.model_config.hf_config
                )
        else:
            files = list(resolved_source.weight_files)
        weights = weight_utils.safetensors_weights_iterator(files)
        if self.load_config.draft_model_idx is not None:
            return self._filter_mtp_weights(
                weights, source.prefix, self.load_config.draft_model_idx
            )
        if self.counter_before_loading_weights == 0.0:
            self.counter_before_loading_weights = time.perf_counter()
        return ((source.prefix + name, tensor) for (name, tensor) in weights)

    @classmethod
    def _filter_mtp_weights(cls, weights_iterator, prefix, draft_model_idx):
        for name, tensor in weights_iterator:
            match = cls._MTP_PATTERN.match(name)
            if match is not None:
                if int(match.group(1)) != draft_model_idx:
                    continue
                name = name.replace(match.group(), "model.mtp.layers.0.")
            yield (prefix + name, tensor)

    def _get_all_weights(self, model_config, model):
        yield from self._get_weights_iterator(
            DefaultModelLoader.Source.init_new(model_config, model)
        )
        for source in getattr(model, "secondary_weights", ()):
            yield from self._get_weights_iterator(source)

    def download_model(self, model_config) -> None:
        self._prepare_weights(model_config.model_path, model_config.revision, fall_back_to_pt=True)

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
    if load_config.load_format == LoadFormat.SAFETENSORS:
        return DefaultModelLoader(load_config)
    raise ValueError(f"stand-in: a loader class or safetensors, not {load_config.load_format!r}")
