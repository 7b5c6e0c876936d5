"""Stand-in for vllm.model_executor.model_loader.weight_utils: no hub here."""


def download_weights_from_hf(
    model_name_or_path, cache_dir, allow_patterns, revision=None, ignore_patterns=None
):
    raise RuntimeError(f"stand-in: no download of {model_name_or_path!r} in tests")
