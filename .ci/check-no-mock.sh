#!/usr/bin/env bash
# Fails when a shipped artefact carries the mock backend or the test fixtures: the `stage`
# binary, the C library, a wheel (its extension module) or a release tarball (what it holds). The markers are text that only
# backend-mock's code holds (its fault injection and its malformed cases), so they are in a
# binary exactly when that code was linked in; a mock build (`--features mock`) fails this check.
#
#   .ci/check-no-mock.sh target/release/stage target/dist/*.whl target/dist/*.tar.gz
set -euo pipefail
markers=(
  "injected read error on call"
  "injected failure on allocation"
  "shape_disagrees_with_length"
  "index_shard_has_unlisted_tensor"
)
failed=0
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
for artefact in "$@"; do
  # A missing artefact would pass every grep below unseen.
  [ -f "$artefact" ] || { echo "!! $artefact: no such file (not built?)"; exit 1; }
  files=("$artefact")
  if [[ "$artefact" == *.whl ]]; then
    python3 -m zipfile -e "$artefact" "$scratch/$(basename "$artefact")"
    mapfile -t files < <(find "$scratch/$(basename "$artefact")" -name '*.so')
    [ ${#files[@]} -gt 0 ] || { echo "!! $artefact: no extension module inside"; exit 1; }
  elif [[ "$artefact" == *.tar.gz ]]; then
    # A release tarball (scripts/release.sh): its programs and libraries.
    mkdir -p "$scratch/$(basename "$artefact")"
    tar -C "$scratch/$(basename "$artefact")" -xzf "$artefact"
    mapfile -t files < <(find "$scratch/$(basename "$artefact")" -type f \( -name stage -o -name '*.so' -o -name '*.a' \))
    [ ${#files[@]} -gt 0 ] || { echo "!! $artefact: no program or library inside"; exit 1; }
  fi
  for file in "${files[@]}"; do
    found=()
    for marker in "${markers[@]}"; do
      if grep -q -a -F "$marker" "$file"; then found+=("$marker"); fi
    done
    if [ ${#found[@]} -gt 0 ]; then
      echo "!! $artefact ($(basename "$file")): carries the mock backend: ${found[*]}"
      failed=1
    else
      echo "ok $artefact ($(basename "$file")): no mock backend (${#markers[@]} markers absent)"
    fi
  done
done
exit $failed
