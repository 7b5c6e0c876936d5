from vllm.config.load import LoadConfig  # noqa: F401
