#!/usr/bin/env bash
# The SGLang loader class against the real SGLang, on a CPU: installs SGLang (several GB) in a venv
# of its own, then checks that SGLang's own `get_model_loader` takes `StagingModelLoader` as
# `load_format`, that its weight iterator over SGLang's `DefaultModelLoader.Source` gives the
# file's bytes, and that the stand-ins the CI tests use have the real signatures. No engine starts
# (SGLang needs a GPU for that). Usage: [WHEEL=...] scripts/check-sglang.sh [VENV_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-target/sglang-venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check sglang pytest safetensors
# WHEEL=path/to/safetensors_staging-*.whl installs a wheel already built instead of building one.
"$venv/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps "${WHEEL:-./crates/staging-py}"
"$venv/bin/python" -W ignore - <<'PY'
import tempfile
from pathlib import Path
import torch, safetensors.torch, sglang
from sglang.srt.configs.load_config import LoadConfig
from sglang.srt.model_loader.loader import DefaultModelLoader, get_model_loader
from safetensors_staging.sglang import StagingModelLoader
print("sglang", sglang.__version__, "torch", torch.__version__)
loader = get_model_loader(LoadConfig(load_format=StagingModelLoader, model_loader_extra_config={"backend": "host"}))
assert type(loader) is StagingModelLoader, type(loader)
print("get_model_loader(load_format=StagingModelLoader) ->", type(loader).__module__ + "." + type(loader).__qualname__)
g = torch.Generator().manual_seed(1)
want = {"embed.weight": torch.randn(64, 16, generator=g), "proj.weight": torch.randn(8, 16, generator=g)}
d = Path(tempfile.mkdtemp())
safetensors.torch.save_file(want, d / "model.safetensors")
got = dict(loader._get_weights_iterator(DefaultModelLoader.Source(str(d), None, prefix="")))
assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
print("weights through SGLang's DefaultModelLoader.Source: bytes equal for", sorted(got),
      "bytes_read", loader.last_report["bytes_read"])
PY
"$venv/bin/python" -m pytest -q -p no:cacheprovider crates/staging-py/tests/test_engines_sglang.py -k real_signatures -rs
