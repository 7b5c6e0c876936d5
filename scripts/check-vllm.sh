#!/usr/bin/env bash
# The vLLM plugin against the real vLLM, on a CPU (no engine starts: vLLM needs a GPU for that).
# Installs vLLM (several GB of CUDA wheels; the version last checked unless VLLM=vllm==X) in a
# venv of its own, then checks, printing a line for each:
#   1. vLLM's own plugin loader finds `safetensors_staging.vllm:register` through the entry point,
#      and `get_model_loader(LoadConfig(load_format="staging"))` returns our StagingModelLoader;
#   2. vLLM's own argument parser and `create_engine_config` take `--load-format staging`, and its
#      `load_model` builds its Qwen2ForCausalLM (sharded with an index; tied embeddings; a tied
#      config whose checkpoint holds its own lm_head, config and weights in two directories) byte
#      for byte as with `--load-format safetensors`; vLLM's `get_all_weights` gives the same
#      tensors under both for a model's file patterns, unused weights and secondary weights
#      (another directory, a subfolder); a checkpoint lacking an exempt weight and
#      one lacking a weight vLLM checks give the same outcome under both; vLLM's own in-place
#      `reload_weights` (what `collective_rpc("reload_weights")` runs) reloads two of those
#      models from a new path through the plugin (the one with `weights` elsewhere included);
#   3. the stand-ins the CI tests use have the real signatures, both directions.
# Usage: [WHEEL=...] [VLLM=vllm==X] scripts/check-vllm.sh [VENV_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-target/vllm-venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
# The vLLM checked last (docs/guides/engines.md; the plugin supports >=0.33,<0.35): VLLM=vllm==X
# checks another, VLLM=vllm==0.33.0 the oldest.
vllm=${VLLM:-vllm==0.34.0}
pip=("$venv/bin/pip" install --quiet --disable-pip-version-check)
if ! "${pip[@]}" "$vllm" pytest safetensors 2> "$venv/install.err"; then
  tail -n 3 "$venv/install.err"
  # Seen with vLLM 0.34.0 (2026-12-04): it pins flashinfer-python==0.7.3, which PyPI does not have.
  echo "!! pip cannot install $vllm with its dependencies (above); installing it without them, then"
  echo "!! each of its requirements but flashinfer-python (GPU kernels: nothing here runs them)"
  "${pip[@]}" --no-deps "$vllm"
  "$venv/bin/python" scripts/engine_checks/vllm_requirements.py > "$venv/requirements.txt"
  "${pip[@]}" -r "$venv/requirements.txt" pytest safetensors
fi
# WHEEL=path/to/safetensors_staging-*.whl installs a wheel already built instead of building one.
"$venv/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps "${WHEEL:-./crates/staging-py}"
"$venv/bin/python" scripts/engine_checks/vllm_plugin_found.py
VLLM_TARGET_DEVICE=cpu "$venv/bin/python" -W ignore scripts/engine_checks/vllm_load.py 2> "$venv/load.err" || { tail -n 40 "$venv/load.err"; exit 1; }
"$venv/bin/python" -m pytest -q -p no:cacheprovider crates/staging-py/tests/engines/test_engines_vllm.py -k real_signatures -rs
