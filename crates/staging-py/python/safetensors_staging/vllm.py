"""vLLM plugin: `--load-format staging` reads the weights through this library.

```bash
pip install 'safetensors-staging[vllm]'      # the plugin is found through its entry point
vllm serve MODEL_DIR --load-format staging \\
    --model-loader-extra-config '{"backend": "cufile", "device_memory": "60GiB"}'
```

The package declares `register` in the entry-point group `vllm.general_plugins`, so vLLM calls it
in each of its processes; it registers `StagingModelLoader` under the load format `staging`.
Nothing here imports vLLM (or CUDA) before vLLM itself calls `register` or the class is asked for.

`StagingModelLoader` is vLLM's own `DefaultModelLoader` but for where the bytes come from: vLLM
chooses the files (as for `--load-format safetensors`), filters them, builds the model, calls
`model.load_weights`, checks for weights the checkpoint lacks and reloads in place
(`reload_weights`) as it always does. The tensors it is handed are full (each model narrows them
to its rank's share itself), each owning its memory (vLLM models may keep a tensor past the next
step of the iterator), on vLLM's load device (`load_config.device`, else `--device`; a device
other than a GPU gets host tensors, as from vLLM's own loader). Keys of
`--model-loader-extra-config` (an unknown key is an error naming these):

- `enable_weights_track`: vLLM's own (whether a parameter missing from the checkpoint is an
  error; by default for models that are not quantized);

- `weights`: where the weights are, when not in the model directory: a directory or a URL the
  library reads (`hf://`, `s3://`, `gs://`, `az://`, `http(s)://` and their aliases: `s3a://`,
  `abfs://`, ...; vLLM refuses such a model path for formats not its own, so keep the config in
  a local directory given as the model and the weights here). Without it, a model given as a
  Hub id (`vllm serve org/name --load-format staging`) streams its weights from
  `hf://org/name@<revision>` into the Hugging Face cache as they load, instead of downloading
  them first (vLLM fetches the config itself; `ignore_patterns` do not apply: the library
  reads the index, else `model.safetensors`, else every `*.safetensors` at the root; a model
  whose weights name a subfolder or file patterns of its own is downloaded as vLLM does);
- `backend` (`auto`, `host`, `cufile`, `hipfile`), `device_memory` (a size: the cap on the device
  memory the load holds), `chunk_size`, `threads`;
- `share_reads`: read each byte once across vLLM's world group and broadcast it (as
  `process_group=` does);
- the remote options `concurrency`, `range_size`, `retries`, `bandwidth`, `store_options`,
  `allow_redirect`;
- for a Hub model: `cache` (false: stream without writing the Hugging Face cache) and
  `cache_dir` (default: vLLM's `--download-dir`, else `HF_HUB_CACHE`, else `$HF_HOME/hub`).
"""

from __future__ import annotations

from typing import Any, Iterator, Tuple

from . import _engines, _load
from ._engines import EXTRA_CONFIG_KEYS, LOAD_FORMAT

__all__ = [
    "ENGINE_KEYS",
    "EXTRA_CONFIG_KEYS",
    "LOAD_FORMAT",
    "StagingModelLoader",  # noqa: F822 (made when first asked for: `__getattr__`)
    "register",
]

# The keys of vLLM's own default loader this one takes, meaning what they mean there.
# (`enable_multithread_load` and `num_threads` choose among its readers; this library reads
# with `threads`.)
ENGINE_KEYS = ("enable_weights_track",)


class _AskingVllm:
    """The methods of `StagingModelLoader` that ask vLLM's modules only when called: defined
    here, with the module, and mixed in first when the class is made (the class itself must
    wait for vLLM's `DefaultModelLoader`)."""

    def _world_group_coordinator(self) -> Any:
        from vllm.distributed.parallel_state import get_world_group

        return get_world_group()

    def _engine_device(self) -> Any:
        from vllm.config import get_current_vllm_config_or_none

        config = get_current_vllm_config_or_none()
        if config is None:
            return None
        if config.load_config.device is not None:
            return config.load_config.device
        return config.device_config.device

    def _untie_as_the_checkpoint_says(self, model_config: Any) -> None:
        """vLLM's `ModelConfig.maybe_untie_word_embeddings` (which looked at the model
        directory, not at `weights`): a config tying the word embeddings while the
        checkpoint holds an `lm_head` loads it untied; vLLM re-ties them after loading
        when the two are equal."""
        hf_config = model_config.hf_config
        if not getattr(hf_config, "tie_word_embeddings", False):
            return
        model, revision = model_config.model, model_config.revision
        source = self._streamed(model, revision, own=True, plain=True) or self._model_dir(
            model, True
        )
        remote = ("concurrency", "range_size", "retries", "bandwidth", "store_options")
        with _load.open(
            source, **{k: v for k, v in self.options.items() if k in remote}
        ) as checkpoint:
            if not any(name.endswith("lm_head.weight") for name in checkpoint.keys()):
                return
        hf_config.tie_word_embeddings = False
        hf_config.get_text_config().tie_word_embeddings = False
        model_config.word_embeddings_untied_by_checkpoint = True

    def _get_weights_iterator(self, source: Any) -> Iterator[Tuple[str, Any]]:
        """vLLM's `_get_weights_iterator` with this library reading the tensors."""
        import time

        if getattr(self.load_config, "safetensors_load_strategy", None) == "torchao":
            # Set by vLLM's `load_weights` for a torchao-serialized checkpoint, whose
            # tensor subclasses vLLM's own iterator rebuilds.
            raise ValueError(
                f"load format {LOAD_FORMAT!r} reads plain tensors; this checkpoint is "
                "torchao-serialized, which vLLM's own safetensors iterator rebuilds. "
                "Use --load-format safetensors for this model."
            )
        plain = (
            not source.prefix
            and getattr(source, "subfolder", None) is None
            and source.allow_patterns_overrides is None
        )
        own = source.model_or_path == self._own_path if self._own_path is not None else plain
        files: Any = self._streamed(source.model_or_path, source.revision, own, plain)
        unused = getattr(source, "is_unused_weight", None)
        keep = None
        if files is None:
            hf_folder, files, _, index_file = self._prepare_weights(
                self._model_dir(source.model_or_path, own),
                getattr(source, "subfolder", None),
                source.revision,
                source.fall_back_to_pt,
                source.allow_patterns_overrides,
            )
            files = self._filter_files(source, files, hf_folder, index_file)
            from vllm.model_executor.model_loader import weight_utils

            # The order vLLM's own safetensors iterator reads the files in.
            files = sorted(files, key=getattr(weight_utils, "_natural_sort_key", None))
        elif unused is not None:
            # A streamed checkpoint has no file choice: the model's rule (the one its
            # `load_weights` follows) picks the tensors instead.
            keep = lambda name: not unused(name)  # noqa: E731
        if self.local_expert_ids is not None:
            from vllm.model_executor.model_loader.ep_weight_filter import should_skip_weight

            experts, named = self.local_expert_ids, keep
            keep = lambda name: (  # noqa: E731
                not should_skip_weight(name, experts) and (named is None or named(name))
            )
            files, keep = _through_index(files, keep)
        weights = self._read(files, keep)
        if self.counter_before_loading_weights == 0.0:
            self.counter_before_loading_weights = time.perf_counter()
        return ((source.prefix + name, tensor) for name, tensor in weights)

    def _filter_files(self, source: Any, files: Any, hf_folder: str, index_file: str) -> Any:
        """vLLM's shard filters: `--mm-encoder-only` and `is_unused_checkpoint_weight`."""
        from vllm.model_executor.model_loader import weight_utils

        if self._encoder_only_lm_prefixes is not None and files:
            files = weight_utils.filter_mm_encoder_only_safetensors_files(
                files,
                hf_folder,
                index_file,
                self._encoder_only_lm_prefixes,
                weights_mapper=self._encoder_only_weights_mapper,
            )
            if not files:
                raise RuntimeError(
                    "mm-encoder-only shard filter removed all weight files for "
                    f"`{source.model_or_path}`; check language_model prefixes "
                    f"{self._encoder_only_lm_prefixes}"
                )
        if source.is_unused_weight is not None:
            files = weight_utils.filter_safetensors_files_by_weight_name(
                files, source.is_unused_weight
            )
        return files


def _make_loader_class() -> type:
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    class StagingModelLoader(_AskingVllm, _engines.EngineLoaderMixin, DefaultModelLoader):
        """vLLM's `DefaultModelLoader` whose tensors come from `safetensors_staging`.

        Everything else is vLLM's: which files (`_prepare_weights`, as for its load format
        `safetensors`: the index's shards, `subfolder`, a model's `allow_patterns_overrides`,
        `--ignore-patterns`, the download), its filters (a model's `is_unused_checkpoint_weight`,
        `--mm-encoder-only`, the expert-parallel filter, which this library applies before
        reading), `secondary_weights`, `get_all_weights` (in-place reload), `load_weights` and
        its check for weights the checkpoint lacks (`enable_weights_track`, the quantization
        exemptions), and the device (`--device`, `load_config.device`).

        Args:
            load_config: vLLM's `LoadConfig`; its `model_loader_extra_config` takes the keys
                of `EXTRA_CONFIG_KEYS` and `ENGINE_KEYS`.

        Raises:
            ValueError: an unknown extra-config key, or a value of the wrong kind.
        """

        def __init__(self, load_config: Any) -> None:
            engine = self._configure(load_config, engine_keys=ENGINE_KEYS)
            # vLLM's own checks and state, on the keys it knows; then the config as given.
            DefaultModelLoader.__init__(self, _engines.with_format(load_config, "staging", engine))
            self.load_config = load_config

        def _prepare_weights(self, *args: Any, **kwargs: Any) -> Any:
            """vLLM's file choice, as for its load format `safetensors`."""
            with self._as_format("safetensors"):
                return super()._prepare_weights(*args, **kwargs)

        def download_model(self, model_config: Any) -> None:
            """vLLM's download of the model's safetensors files (of the `weights` directory,
            when given), unless the weights stream from a URL or the Hub as they load."""
            model, revision = model_config.model, model_config.revision
            self._pin(model, model_config)
            if self._streamed(model, revision, own=True, plain=True) is None:
                self._prepare_weights(self._model_dir(model, True), None, revision, True, None)

        def load_model(self, vllm_config: Any, model_config: Any, prefix: str = "") -> Any:
            """vLLM's `load_model`, with the tensors on its load device, and with the
            embedding tying decided from the checkpoint read, when that is `weights`. The
            model keeps the path the `weights` were given for: a reload from another path
            reads that path (`_weights_for`)."""
            config = vllm_config.load_config
            self._pin(model_config.model, model_config)
            self._target = (
                config.device if config.device is not None else vllm_config.device_config.device
            )
            try:
                if self.weights is not None:
                    self._untie_as_the_checkpoint_says(model_config)
                model = super().load_model(vllm_config, model_config, prefix)
            finally:
                self._target = None
            if self.weights is not None:
                model._staging_weights_of = model_config.model
            return model

        def get_all_weights(self, model_config: Any, model: Any) -> Iterator[Tuple[str, Any]]:
            """vLLM's `get_all_weights` (the load's, and `reload_weights`'), knowing which
            source is the model's own and which path the `weights` were given for."""
            self._own_path = model_config.model
            self._weights_of = getattr(model, "_staging_weights_of", None)
            yield from super().get_all_weights(model_config, model)

    return StagingModelLoader


def _through_index(files: Any, keep: Any) -> Tuple[Any, Any]:
    """vLLM's chosen `files` and a rank's `keep` as the checkpoint's index and a `keep` of the
    names the index puts in those files: a load then reads only the headers of the shards
    holding what this rank keeps (an expert-parallel rank of a 163-shard MoE model, a few),
    where a list of files has every header read. The files and `keep` as they were where the
    files are not all in one folder with a `model.safetensors.index.json` listing them (in
    the natural order of their names, as vLLM reads them)."""
    import json
    import os

    if not isinstance(files, (list, tuple)) or not files or not isinstance(files[0], str):
        return files, keep
    folder = os.path.dirname(files[0])
    index = os.path.join(folder, "model.safetensors.index.json")
    if not os.path.isfile(index) or any(os.path.dirname(f) != folder for f in files):
        return files, keep
    try:
        with open(index, encoding="utf-8") as f:
            weight_map = json.load(f)["weight_map"]
    except (OSError, ValueError, KeyError, TypeError):
        return files, keep  # the load reads the files, and says what is wrong with them
    chosen = {os.path.basename(f) for f in files}
    listed = set(weight_map.values()) if isinstance(weight_map, dict) else set()
    if not chosen <= listed:
        return files, keep
    # The library orders an index's shards naturally by name, as vLLM orders the files.
    names = {name for name, file in weight_map.items() if file in chosen}
    return index, lambda name: name in names and keep(name)


__getattr__ = _engines.lazy_class(_make_loader_class, "StagingModelLoader", __name__)


def register() -> None:
    """Registers `StagingModelLoader` as vLLM's load format `staging`.

    The `vllm.general_plugins` entry point; calling it again does nothing.
    """
    from vllm.model_executor.model_loader import register_model_loader

    loader = __getattr__("StagingModelLoader")
    if getattr(register, "_done", None) is loader:
        return
    register_model_loader(LOAD_FORMAT)(loader)
    register._done = loader  # type: ignore[attr-defined]
