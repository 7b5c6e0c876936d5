#!/usr/bin/env bash
# An aarch64 CPython for user-mode emulation: Debian's python3.11 for arm64 and the libraries it
# and NumPy need, unpacked (dpkg -x, nothing installed) into DIR/root, and NumPy's aarch64 wheel
# from PyPI unpacked into DIR/site. scripts/check-release.sh --aarch64-python DIR then imports
# the aarch64 wheel with it under qemu-aarch64 (-L DIR/root).
#
#   .ci/aarch64-python.sh DIR
#
# Needs Debian 12 (bookworm: the package names below are its own) with its arm64 packages
# (`dpkg --add-architecture arm64 && apt-get update`, which this script runs where arm64 is not
# yet a foreign architecture: a lasting change to the machine's apt) and PyPI.
set -euo pipefail
dir=${1:?usage: .ci/aarch64-python.sh DIR}
[ -x "$dir/root/usr/bin/python3.11" ] && [ -d "$dir/site/numpy" ] && exit 0
rm -rf "$dir"
mkdir -p "$dir/debs" "$dir/root" "$dir/site"
dir=$(cd "$dir" && pwd) # absolute: the downloads run in a subfolder
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  dpkg --add-architecture arm64
  apt-get update -q >/dev/null
fi
packages=(python3.11-minimal libpython3.11-minimal libpython3.11-stdlib libc6 zlib1g libexpat1
  libffi8 libbz2-1.0 liblzma5 libssl3 libcrypt1 libuuid1 libgcc-s1 libstdc++6)
# apt's own user cannot write into a folder root made: apt downloads as root, and warns so.
if ! (cd "$dir/debs" && apt-get download -qq "${packages[@]/%/:arm64}" >"$dir/apt.log" 2>&1); then
  cat "$dir/apt.log" >&2
  echo "!! apt-get download of the arm64 packages failed (Debian 12's names: python3.11, libffi8, libssl3)" >&2
  exit 1
fi
for deb in "$dir"/debs/*.deb; do dpkg -x "$deb" "$dir/root"; done
[ -x "$dir/root/usr/bin/python3.11" ] || { echo "!! no aarch64 python3.11 unpacked" >&2; exit 1; }
python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --platform manylinux_2_28_aarch64 --platform manylinux2014_aarch64 --python-version 3.11 \
  -d "$dir/debs" numpy
python3 -m zipfile -e "$dir"/debs/numpy-*.whl "$dir/site"
rm -rf "$dir/debs"
