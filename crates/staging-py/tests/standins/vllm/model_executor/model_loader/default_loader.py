"""Stand-in for vllm.model_executor.model_loader.default_loader: vLLM 0.33's `DefaultModelLoader`
for safetensors checkpoints, shortened from the real one (Apache-2.0, the vLLM project): its
extra-config check, file choice (`_prepare_weights`: patterns, `subfolder`, the index's files,
overrides), shard filters, `get_all_weights` (with `secondary_weights`), the expert-parallel
filter (from the stand-in config's `local_expert_ids`) and `load_weights` with its check for
weights the checkpoint lacks, exemptions included. Left out: `.bin`/`.pt`, npcache, the other
iterators, ModelScope, tracing, timing logs."""

import dataclasses
import glob
import os
import time
from typing import Callable, Optional

from vllm.model_executor.model_loader import weight_utils
from vllm.model_executor.model_loader.base_loader import BaseModelLoader


class DefaultModelLoader(BaseModelLoader):
    DEFAULT_NUM_THREADS = 8

    @dataclasses.dataclass
    class Source:
        model_or_path: str
        revision: Optional[str]
        subfolder: Optional[str] = None
        prefix: str = ""
        fall_back_to_pt: bool = True
        allow_patterns_overrides: Optional[list] = None
        is_unused_weight: Optional[Callable[[str], bool]] = None

    counter_before_loading_weights: float = 0.0
    counter_after_loading_weights: float = 0.0

    def __init__(self, load_config):
        super().__init__(load_config)
        self.local_expert_ids = None
        self._encoder_only_lm_prefixes = None
        self._encoder_only_weights_mapper = None
        extra_config = load_config.model_loader_extra_config
        if not isinstance(extra_config, dict):
            raise ValueError(
                f"model_loader_extra_config must be a dict for load format "
                f"{load_config.load_format}, got {type(extra_config).__name__}"
            )
        allowed_keys = {"enable_multithread_load", "num_threads", "enable_weights_track"}
        unexpected_keys = set(extra_config.keys()) - allowed_keys
        if unexpected_keys:
            raise ValueError(
                f"Unexpected extra config keys for load format {load_config.load_format}: "
                f"{unexpected_keys}"
            )
        self.enable_weights_track = extra_config.get("enable_weights_track", None)

    def _prepare_weights(
        self, model_name_or_path, subfolder, revision, fall_back_to_pt, allow_patterns_overrides
    ):
        is_local = os.path.isdir(model_name_or_path)
        load_format = self.load_config.load_format
        index_file = "model.safetensors.index.json"
        if load_format == "safetensors":
            use_safetensors = True
            allow_patterns = ["*.safetensors"]
        else:
            raise ValueError(f"Unknown load_format: {load_format}")
        if allow_patterns_overrides is not None:
            allow_patterns = allow_patterns_overrides
        if not is_local:
            hf_folder = weight_utils.download_weights_from_hf(
                model_name_or_path,
                self.load_config.download_dir,
                allow_patterns,
                revision,
                subfolder=subfolder,
                ignore_patterns=self.load_config.ignore_patterns,
            )
        else:
            hf_folder = model_name_or_path
        if subfolder is not None:
            hf_folder = os.path.join(hf_folder, subfolder)
        hf_weights_files = []
        for pattern in allow_patterns:
            hf_weights_files += glob.glob(os.path.join(hf_folder, pattern))
            if len(hf_weights_files) > 0:
                break
        if allow_patterns_overrides is None:
            hf_weights_files = weight_utils.filter_duplicate_safetensors_files(
                hf_weights_files, hf_folder, index_file
            )
        if len(hf_weights_files) == 0:
            raise RuntimeError(f"Cannot find any model weights with `{model_name_or_path}`")
        return hf_folder, hf_weights_files, use_safetensors, index_file

    def _get_weights_iterator(self, source):
        hf_folder, hf_weights_files, use_safetensors, index_file = self._prepare_weights(
            source.model_or_path,
            source.subfolder,
            source.revision,
            source.fall_back_to_pt,
            source.allow_patterns_overrides,
        )
        if self._encoder_only_lm_prefixes is not None and hf_weights_files:
            hf_weights_files = weight_utils.filter_mm_encoder_only_safetensors_files(
                hf_weights_files, hf_folder, index_file, self._encoder_only_lm_prefixes
            )
        if source.is_unused_weight is not None:
            hf_weights_files = weight_utils.filter_safetensors_files_by_weight_name(
                hf_weights_files, source.is_unused_weight
            )
        weights_iterator = weight_utils.safetensors_weights_iterator(
            hf_weights_files,
            self.load_config.use_tqdm_on_load,
            self.load_config.safetensors_load_strategy,
            local_expert_ids=self.local_expert_ids,
        )
        if self.counter_before_loading_weights == 0.0:
            self.counter_before_loading_weights = time.perf_counter()
        return ((source.prefix + name, tensor) for (name, tensor) in weights_iterator)

    def get_all_weights(self, model_config, model):
        primary_weights = DefaultModelLoader.Source(
            model_config.model,
            model_config.revision,
            prefix="",
            fall_back_to_pt=getattr(model, "fall_back_to_pt_during_load", True),
            allow_patterns_overrides=getattr(model, "allow_patterns_overrides", None),
            is_unused_weight=getattr(model, "is_unused_checkpoint_weight", None),
        )
        yield from self._get_weights_iterator(primary_weights)
        for source in getattr(model, "secondary_weights", ()):
            yield from self._get_weights_iterator(source)

    def download_model(self, model_config):
        self._prepare_weights(
            model_name_or_path=model_config.model,
            subfolder=None,
            revision=model_config.revision,
            fall_back_to_pt=True,
            allow_patterns_overrides=None,
        )

    def _init_mm_encoder_only_weight_filter(self, model, model_config):
        mm_config = getattr(model_config, "multimodal_config", None)
        if mm_config is None or not mm_config.mm_encoder_only:
            self._encoder_only_lm_prefixes = None
            return
        self._encoder_only_lm_prefixes = tuple(getattr(model, "_language_model_names", ()))

    def _init_ep_weight_filter(self, model_config):
        from vllm.config import get_current_vllm_config

        parallel_config = get_current_vllm_config().parallel_config
        if not (
            getattr(model_config, "is_moe", False)
            and parallel_config.enable_expert_parallel
            and parallel_config.enable_ep_weight_filter
        ):
            return
        if parallel_config.enable_eplb:
            return
        self.local_expert_ids = parallel_config.local_expert_ids

    def load_weights(self, model, model_config):
        self._init_ep_weight_filter(model_config)
        self._init_mm_encoder_only_weight_filter(model, model_config)
        loaded_weights = model.load_weights(self.get_all_weights(model_config, model))
        self.counter_after_loading_weights = time.perf_counter()
        default_enable_weights_track = (
            model_config.quantization is None and loaded_weights is not None
        )
        enable_weights_track = (
            self.enable_weights_track
            if self.enable_weights_track is not None
            else default_enable_weights_track
        )
        if enable_weights_track:
            self.track_weights_loading(
                model, loaded_weights, quantized=model_config.quantization is not None
            )

    def track_weights_loading(self, model, loaded_weights, quantized=False):
        weights_to_load = {name for name, _ in model.named_parameters()}
        if loaded_weights is not None:
            for name, module in model.named_modules():
                quant_method = getattr(module, "quant_method", None)
                has_online_quant = getattr(quant_method, "uses_meta_device", False)
                has_postprocess_quant = getattr(quant_method, "process_weights_after_loading", None)
                if has_online_quant or has_postprocess_quant:
                    for param_name, param in module.named_parameters():
                        if quantized and not has_online_quant and param.numel() > 0:
                            continue
                        full_name = f"{name}.{param_name}" if name else param_name
                        loaded_weights.add(full_name)
            weights_not_loaded = weights_to_load - loaded_weights
            if weights_not_loaded:
                raise ValueError(
                    f"Following weights were not initialized from checkpoint: {weights_not_loaded}"
                )
