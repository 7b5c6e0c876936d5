"""Stand-in for vllm.model_executor.model_loader: the loader registry."""

from vllm.model_executor.model_loader.base_loader import BaseModelLoader

_LOAD_FORMAT_TO_MODEL_LOADER = {}
REGISTRATIONS = []  # what the tests count


def register_model_loader(load_format: str):
    def _wrapper(model_loader_cls):
        if not issubclass(model_loader_cls, BaseModelLoader):
            raise ValueError("The model loader must be a subclass of `BaseModelLoader`.")
        _LOAD_FORMAT_TO_MODEL_LOADER[load_format] = model_loader_cls
        REGISTRATIONS.append((load_format, model_loader_cls))
        return model_loader_cls

    return _wrapper


def get_model_loader(load_config):
    load_format = load_config.load_format
    if load_format not in _LOAD_FORMAT_TO_MODEL_LOADER:
        raise ValueError(f"Load format `{load_format}` is not supported")
    return _LOAD_FORMAT_TO_MODEL_LOADER[load_format](load_config)


def _builtin():
    # vLLM's own format, for comparing with (imported here: default_loader imports this module).
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    _LOAD_FORMAT_TO_MODEL_LOADER["safetensors"] = DefaultModelLoader


_builtin()
