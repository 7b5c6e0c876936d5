#!/usr/bin/env bash
# One prepared command for a CUDA machine with the release `stage` binary carried over:
#   scripts/gpu-check.sh [STAGE_BINARY] [SIZE_GIB]
# Prints one table and writes $OUT/gpu-check.{md,json}. See scripts/gpu_check.py.
#
# To prepare it from the development machine (no Rust on the GPU machine):
#   scripts/gpu-prepare.sh target/pyvenv/bin/python   # fills the git-excluded gpu-carry/
# then run `bash scripts/gpu-check.sh gpu-carry/stage 8` there with gpu-carry carried.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
stage=${1:-gpu-carry/stage}
size=${2:-8}
out=${OUT:-gpu-check-out}
nvidia-smi -L || true
# The carried wheels: this package (abi3) and fastsafetensors; no network there, no deps.
carry=$(dirname "$stage")
if compgen -G "$carry/*.whl" >/dev/null; then
  python3 -m pip install --quiet --no-deps --no-index "$carry"/*.whl || echo "!! carried wheels did not install"
fi
python3 -c "import torch, safetensors; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'safetensors', safetensors.__version__)" || true
serve=()
[ -x "$carry/range_serve" ] && serve=(--range-serve "$carry/range_serve")
[ -x "$carry/delay_proxy" ] && serve+=(--delay-proxy "$carry/delay_proxy")
[ -x "$carry/fake_hub" ] && serve+=(--fake-hub "$carry/fake_hub")
[ -x "$carry/callers_stream" ] && serve+=(--callers-stream "$carry/callers_stream")
exec python3 "$here/gpu_check.py" --stage "$stage" --size-gib "$size" --out "$out" "${serve[@]}"
