"""Stand-in for vllm.model_executor.model_loader.weight_utils: the file filters and the
safetensors iterator of vLLM 0.33, shortened (no hub here: a download is an error)."""

import json
import os

from safetensors import safe_open


def download_weights_from_hf(
    model_name_or_path,
    cache_dir,
    allow_patterns,
    revision=None,
    subfolder=None,
    ignore_patterns=None,
):
    raise RuntimeError(f"stand-in: no download of {model_name_or_path!r} in tests")


def download_safetensors_index_file_from_hf(
    model_name_or_path, index_file, cache_dir, subfolder=None, revision=None
):
    raise RuntimeError(f"stand-in: no download of {model_name_or_path!r} in tests")


def maybe_download_from_modelscope(
    model, revision=None, download_dir=None, ignore_patterns=None, allow_patterns=None
):
    return None


def filter_duplicate_safetensors_files(hf_weights_files, hf_folder, index_file):
    index_file_name = os.path.join(hf_folder, index_file)
    if not os.path.isfile(index_file_name):
        return hf_weights_files
    with open(index_file_name) as f:
        weight_map = json.load(f)["weight_map"]
    in_index = {os.path.join(hf_folder, name) for name in weight_map.values()}
    missing = in_index - set(hf_weights_files)
    if missing:
        raise FileNotFoundError(f"Weight files referenced in index but missing: {missing}")
    return [f for f in hf_weights_files if f in in_index]


def filter_files_not_needed_for_inference(hf_weights_files):
    blacklist = ["training_args.bin", "optimizer.bin", "optimizer.pt", "scheduler.pt", "scaler.pt"]
    return [f for f in hf_weights_files if not any(f.endswith(x) for x in blacklist)]


def filter_safetensors_files_by_weight_name(hf_weights_files, is_unused_weight):
    kept = []
    for st_file in hf_weights_files:
        with safe_open(st_file, framework="pt") as f:
            if not all(is_unused_weight(name) for name in f.keys()):
                kept.append(st_file)
    return kept or hf_weights_files


def filter_mm_encoder_only_safetensors_files(
    hf_weights_files, hf_folder, index_file, language_model_prefixes, *, weights_mapper=None
):
    # Stand-in: the shards holding a tensor outside the language model (the real one reads
    # the index and maps names through `weights_mapper`).
    prefixes = tuple(language_model_prefixes)
    kept = []
    for st_file in hf_weights_files:
        with safe_open(st_file, framework="pt") as f:
            if not all(name.startswith(prefixes) for name in f.keys()):
                kept.append(st_file)
    return kept


def safetensors_weights_iterator(
    hf_weights_files,
    use_tqdm_on_load,
    safetensors_load_strategy=None,
    local_expert_ids=None,
    *,
    safetensors_prefetch_num_threads=0,
    safetensors_prefetch_block_size=0,
):
    from vllm.model_executor.model_loader.ep_weight_filter import should_skip_weight

    for st_file in sorted(hf_weights_files):
        with safe_open(st_file, framework="pt") as f:
            for name in f.keys():
                if not should_skip_weight(name, local_expert_ids):
                    yield name, f.get_tensor(name)
