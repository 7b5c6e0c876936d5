#!/usr/bin/env bash
# The SGLang plugin against the real SGLang, on a CPU (no server starts: SGLang needs a GPU for
# that). Installs SGLang (several GB; the version last checked unless SGLANG=sglang==X) in a venv
# of its own, then checks, printing a line for each:
#   1. SGLang's `load_plugins()` finds our entry point; its own argument parsing and checks take
#      `--load-format staging`; its LoadConfig and get_model_loader turn it into our class;
#   2. SGLang's own update_weights_from_disk with load format `staging` reloads in place, reading
#      with the server's --model-loader-extra-config;
#   3. SGLang's own `load_model`, as its ModelRunner calls it, builds its Qwen2ForCausalLM
#      (sharded with an index; tied embeddings; config and weights in two directories; a
#      checkpoint lacking a weight) with `--load-format staging` byte for byte as with
#      `--load-format safetensors`; SGLang's `_get_all_weights` gives the same tensors under
#      both for a model's file patterns and secondary weights, and reads the files in the order
#      of SGLANG_SORT_WEIGHT_FILES; update_weights_from_disk of the server with `weights`
#      elsewhere reads the new path;
#      `--model-checksum` is verified for both (a changed byte refused by both); a quantization
#      SGLang gives a loader of its own is refused by name;
#   4. a `register` that cannot hook is logged by SGLang as our RuntimeError, and
#      `--load-format staging` is then SGLang's "invalid choice";
#   5. the stand-ins the CI tests use have the real signatures, both directions.
# Usage: [WHEEL=...] [SGLANG=sglang==X] scripts/check-sglang.sh [VENV_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-target/sglang-venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
# The SGLang this was last checked with (docs/guides/engines.md); SGLANG=sglang==X checks another.
"$venv/bin/pip" install --quiet --disable-pip-version-check "${SGLANG:-sglang==0.5.23}" pytest safetensors
# WHEEL=path/to/safetensors_staging-*.whl installs a wheel already built instead of building one.
"$venv/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps "${WHEEL:-./crates/staging-py}"
"$venv/bin/python" -W ignore scripts/engine_checks/sglang_plugin_found.py
"$venv/bin/python" -W ignore scripts/engine_checks/sglang_update_weights.py
"$venv/bin/python" -W ignore scripts/engine_checks/sglang_load.py
"$venv/bin/python" -W ignore scripts/engine_checks/sglang_register_failure.py
"$venv/bin/python" -m pytest -q -p no:cacheprovider crates/staging-py/tests/engines/test_engines_sglang.py -k real_signatures -rs
