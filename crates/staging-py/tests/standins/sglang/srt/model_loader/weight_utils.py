"""Stand-in for sglang.srt.model_loader.weight_utils (SGLang 0.5.23, shortened): the index
filter, GLM4's `mtp.safetensors` rule, the checksum check and a safetensors iterator; no hub
here (a download is an error)."""

import json
import os

from safetensors import safe_open

VERIFIED = []  # the folders `verify` was asked to check (the tests read it)


def download_weights_from_hf(
    model_name_or_path, cache_dir, allow_patterns, revision, ignore_patterns=None
):
    raise RuntimeError(f"stand-in: no download of {model_name_or_path!r} in tests")


def verify(model_path, checksums_source):
    # Stand-in for sglang.srt.utils.model_file_verifier.verify.
    VERIFIED.append((model_path, checksums_source))


def filter_duplicate_safetensors_files(
    hf_weights_files, hf_folder, index_file, allow_patterns=None
):
    index_file_name = os.path.join(hf_folder, index_file)
    if not os.path.isfile(index_file_name):
        return hf_weights_files
    with open(index_file_name) as f:
        weight_map = json.load(f)["weight_map"]
    in_index = {os.path.join(hf_folder, name) for name in weight_map.values()}
    return [f for f in hf_weights_files if f in in_index]


def maybe_add_mtp_safetensors(hf_weights_files, hf_folder, index_file, hf_config):
    arch = getattr(hf_config, "architectures", [None])[0]
    if arch != "Glm4MoeForCausalLM" or getattr(hf_config, "num_nextn_predict_layers", 0) <= 0:
        return hf_weights_files
    mtp = os.path.join(hf_folder, "mtp.safetensors")
    if os.path.isfile(mtp) and mtp not in hf_weights_files:
        return [*hf_weights_files, mtp]
    return hf_weights_files


def safetensors_weights_iterator(hf_weights_files):
    for st_file in hf_weights_files:
        with safe_open(st_file, framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)
