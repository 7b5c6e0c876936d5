#!/usr/bin/env bash
# The release artefacts, for x86_64 and aarch64 Linux, built on one x86_64 machine with no
# container: zig (the `ziglang` package from PyPI) links every artefact against glibc 2.28, so
# they run on any Linux with glibc 2.28 or newer (RHEL 8, Debian 10, Ubuntu 18.10 and later).
#
#   scripts/release.sh [--out DIR] [--arch x86_64,aarch64] [--what wheel,sdist,c,stage]
#
# Into DIR (default target/dist), for each architecture ARCH:
#
#   safetensors_staging-VERSION-cp39-abi3-manylinux_2_28_ARCH.whl
#       the Python package (CPython 3.9+, one wheel for every version), checked by
#       `auditwheel show` to be manylinux_2_28 or older with no library outside the policy
#   staging-ffi-VERSION-ARCH-linux-gnu.tar.gz
#       the C library as `cmake --install` lays it out: include/ (staging_ffi.h, staging.hpp),
#       lib/libstaging_ffi.so and .a, lib/cmake/staging_ffi/, lib/pkgconfig/staging_ffi.pc
#   stage-VERSION-ARCH-linux-gnu.tar.gz
#       bin/stage, the command
#
# and once: safetensors_staging-VERSION.tar.gz, the source distribution, and SHA256SUMS. The
# wheels are built from the sdist (unpacked outside the checkout), so each one shows it builds.
#
# Needs: this machine's Rust (rustup adds the aarch64 standard library if it is missing), cmake
# (for the C library), python3 with venv and PyPI (maturin, ziglang and auditwheel, pinned in
# scripts/release-tools.txt, go into target/release-tools). Each artefact is checked for its
# architecture (readelf) after it is built; scripts/check-release.sh then installs and runs them
# as a user would.
#
# `stage` and the C library are linked by the wheel's zig toolchain: maturin's, recorded from the
# wheel's build (target/zig-env). Asked for without the wheel, and with none recorded, the wheel
# of that architecture is built first and not kept.
set -euo pipefail
cd "$(dirname "$0")/.."

out=target/dist
arches=x86_64,aarch64
what=wheel,sdist,c,stage
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --arch) arches=$2; shift 2 ;;
    --what) what=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
wants() { [[ ",$what," == *",$1,"* ]]; }
IFS=, read -r -a asked <<< "$what"
for thing in "${asked[@]}"; do
  case "$thing" in wheel|sdist|c|stage) ;; *) echo "unknown artefact '$thing' (wheel, sdist, c, stage)" >&2; exit 2 ;; esac
done

say() { echo "$(date +%T) -- $*"; }

version=$(sed -n 's/^version = "\([0-9.]*\)"$/\1/p' Cargo.toml | head -n 1)
[ -n "$version" ] || { echo "no version in Cargo.toml's [workspace.package]" >&2; exit 1; }
mkdir -p "$out"
out=$(cd "$out" && pwd)

# The build tools, pinned, in a venv of their own (reinstalled when the pins change).
tools=$PWD/target/release-tools
pins=$(cat scripts/release-tools.txt)
if [ ! -f "$tools/.installed" ] || [ "$pins" != "$(cat "$tools/.installed")" ]; then
  say "the build tools into $tools"
  rm -rf "$tools"
  python3 -m venv "$tools"
  "$tools/bin/pip" install --quiet --disable-pip-version-check --no-cache-dir -r scripts/release-tools.txt
  echo "$pins" > "$tools/.installed"
  # What an earlier maturin recorded names its wrappers: not this one's.
  rm -rf target/zig-env
fi
real_cargo=$(command -v cargo)
# maturin finds zig as `python -m ziglang` of the Python on PATH.
export PATH="$tools/bin:$PATH"

# glibc 2.28: manylinux_2_28, the oldest glibc that has every symbol the Rust code calls (statx).
glibc=2.28
triple_of() { echo "$1-unknown-linux-gnu"; }
machine_of() { case "$1" in x86_64) echo "Advanced Micro Devices X86-64";; aarch64) echo "AArch64";; esac; }

# The ELF files under a path are all for ARCH (readelf's Machine line), or it fails.
check_arch() {
  local arch=$1 path=$2 file machine bad=0 seen=0
  while IFS= read -r -d '' file; do
    [ "$(head -c 4 "$file" | od -An -tx1 | tr -d ' ')" = 7f454c46 ] || continue
    seen=$((seen + 1))
    machine=$(readelf -h "$file" | sed -n 's/^ *Machine: *//p')
    if [ "$machine" != "$(machine_of "$arch")" ]; then
      echo "!! $file is for '$machine', not $arch" >&2
      bad=1
    fi
  done < <(find "$path" -type f -print0)
  [ "$seen" -gt 0 ] || { echo "!! no ELF file under $path" >&2; return 1; }
  return $bad
}

# The sdist first: every wheel is built from it, unpacked outside the checkout, so that it is
# the sdist that builds (and nothing the checkout has that the sdist lacks goes into a wheel).
# Its files are made newer than any build: cargo compiles this project's crates from the
# sdist's sources, not taking the checkout's builds for current (their fingerprints do not name
# their folder); the crates.io dependencies are shared with earlier builds in target/.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# (Made for every run: `stage` and the C library may need a wheel built first, below.)
say "the source distribution"
maturin sdist -m crates/staging-py/Cargo.toml --out "$work" >"$work/sdist.log" 2>&1 \
  || { cat "$work/sdist.log"; exit 1; }
sdist="$work/safetensors_staging-$version.tar.gz"
tar -C "$work" -xzf "$sdist"
find "$work/safetensors_staging-$version" -type f -exec touch {} +
if wants sdist; then
  rm -f "$out/safetensors_staging-$version.tar.gz"
  cp "$sdist" "$out/"
fi

# maturin links the wheel with zig through wrapper scripts it writes (C compiler, C++ compiler,
# ar and linker, each for glibc 2.28) and a few variables it gives cargo (those wrappers, and
# cargo's target-applies-to-host so that they link only the target's code). A `cargo` first on
# PATH during the wheel's build records that environment, one file per architecture; `stage`
# and the C library are built by plain cargo under it, in the wheel's target directory, so the
# crates all three share are compiled once per architecture. cargo-zigbuild, which built them
# before, writes wrappers of its own: cargo saw another C compiler and linker and compiled the
# whole tree again. x86_64's `stage` and C library after its wheel took 263 CPU seconds of
# rustc that way, 141 in all now (2026-12-08); what is still compiled twice is what sits above
# the proc macros, whose `syn` has one more feature in the wheel's build.
# This project's own crates that the wheel compiled from the sdist's copy (made from the checkout
# at the start of this run, the same files) are fresh for the checkout's build too: cargo
# fingerprints a path by its place in the workspace. An sdist of an earlier run is gone, so its
# builds are stale, and compiled again from the checkout.
zig_env=$PWD/target/zig-env
mkdir -p "$zig_env" "$work/shim"
cat > "$work/shim/cargo" <<EOF
#!/bin/sh
# maturin builds the wheel with "cargo rustc": its environment, for stage and the C library.
if [ "\$1" = rustc ] && [ -n "\${STAGING_ZIG_ENV:-}" ]; then env -0 > "\$STAGING_ZIG_ENV"; fi
exec "$real_cargo" "\$@"
EOF
chmod +x "$work/shim/cargo"
# What of a recorded environment is the zig toolchain's (nothing of PyO3's or pip's).
zig_keys='^((AR|CC|CXX|RANLIB|CMAKE_TOOLCHAIN_FILE|BINDGEN_EXTRA_CLANG_ARGS)_[a-z0-9_]+|CARGO_TARGET_[A-Z0-9_]+_LINKER|CARGO_ZIGBUILD_[A-Za-z0-9_]+|ZIG_COMMAND|CARGO_UNSTABLE_TARGET_APPLIES_TO_HOST|CARGO_TARGET_APPLIES_TO_HOST|__CARGO_TEST_CHANNEL_OVERRIDE_DO_NOT_USE_THIS)='
# Exports the zig toolchain recorded for `triple` (run in a subshell); fails where none is
# recorded, or where its linker is gone (a cleared cache).
zig_toolchain() {
  local kv linker
  [ -f "$zig_env/$1" ] || return 1
  while IFS= read -r -d '' kv; do
    if [[ $kv =~ $zig_keys ]]; then export "$kv"; fi
  done < "$zig_env/$1"
  linker=CARGO_TARGET_$(echo "$1" | tr 'a-z-' 'A-Z_')_LINKER
  [ -x "${!linker:-}" ]
}

# The wheel for `arch` into `dest`, from the sdist, its toolchain recorded.
build_wheel() {
  local arch=$1 triple=$2 dest=$3 wheel unpacked
  rm -f "$dest"/safetensors_staging-"$version"-*-manylinux_*_"$arch".whl "$zig_env/$triple"
  STAGING_ZIG_ENV=$zig_env/$triple PATH="$work/shim:$PATH" \
    MATURIN_PEP517_ARGS="--zig --target $triple --compatibility manylinux_${glibc/./_}" \
    CARGO_TARGET_DIR=$PWD/target pip wheel -v --no-build-isolation --no-deps --no-cache-dir \
    --disable-pip-version-check "$work/safetensors_staging-$version" -w "$dest" >"$work/wheel.log" 2>&1 \
    || { tail -n 60 "$work/wheel.log"; exit 1; }
  if ! grep -q "Compiling staging-py" "$work/wheel.log"; then
    echo "!! the wheel compiled nothing of the sdist (cargo took an earlier build):" >&2
    grep -i "compiling\|finished" "$work/wheel.log" >&2 || true
    exit 1
  fi
  if ! (zig_toolchain "$triple"); then
    echo "!! maturin's zig toolchain was not recorded from the wheel's build (target/zig-env/$triple)" >&2
    exit 1
  fi
  echo "built from the sdist: $(grep -c ' Compiling ' "$work/wheel.log") crates compiled"
  wheel=$(ls "$dest"/safetensors_staging-"$version"-*-manylinux_*_"$arch".whl)
  # The policy check: which manylinux tag the wheel's libraries allow, and nothing outside it.
  auditwheel show "$wheel" | tee "$work/auditwheel.txt"
  # (auditwheel wraps its lines: read the text as one line.)
  if ! tr -s '\n ' '  ' < "$work/auditwheel.txt" \
       | grep -q "is consistent with the following platform tag: \"manylinux_2_\(2[0-8]\|1[0-9]\|[0-9]\)_$arch\""; then
    echo "!! auditwheel: $wheel is not manylinux_2_28 or older" >&2
    exit 1
  fi
  unpacked=$(mktemp -d -p "$work")
  python3 -m zipfile -e "$wheel" "$unpacked"
  check_arch "$arch" "$unpacked"
  rm -rf "$unpacked"
}

IFS=, read -r -a arch_list <<< "$arches"
for arch in "${arch_list[@]}"; do
  case "$arch" in x86_64|aarch64) ;; *) echo "unknown architecture '$arch' (x86_64, aarch64)" >&2; exit 2 ;; esac
  triple=$(triple_of "$arch")
  if ! rustup target list --installed | grep -qx "$triple"; then
    say "rustup target add $triple"
    rustup target add "$triple"
  fi

  if wants wheel; then
    say "$arch: the wheel, from the sdist (maturin, zig, manylinux_${glibc/./_})"
    build_wheel "$arch" "$triple" "$out"
  elif { wants stage || wants c; } && ! (zig_toolchain "$triple"); then
    say "$arch: the wheel (not kept), for its zig toolchain: none is recorded in target/zig-env"
    mkdir -p "$work/unkept"
    build_wheel "$arch" "$triple" "$work/unkept"
  fi

  if wants stage; then
    say "$arch: stage"
    (
      zig_toolchain "$triple" || { echo "!! no zig toolchain recorded for $triple" >&2; exit 1; }
      cargo build --quiet --release -p staging-cli --bin stage --target "$triple" --target-dir "$PWD/target"
    )
    name="stage-$version-$arch-linux-gnu"
    tree=$(mktemp -d -p "$work")
    mkdir -p "$tree/$name/bin"
    cp "target/$triple/release/stage" "$tree/$name/bin/"
    check_arch "$arch" "$tree"
    tar -C "$tree" -czf "$out/$name.tar.gz" "$name"
    rm -rf "$tree"
  fi

  if wants c; then
    say "$arch: the C library (CMake install, packed)"
    name="staging-ffi-$version-$arch-linux-gnu"
    build=target/release-cmake/$arch
    tree=$(mktemp -d -p "$work")
    (
      zig_toolchain "$triple" || { echo "!! no zig toolchain recorded for $triple" >&2; exit 1; }
      cmake -S crates/staging-ffi -B "$build" -DSTAGING_FFI_CARGO="$real_cargo" \
        -DSTAGING_FFI_RUST_TARGET="$triple" -DSTAGING_FFI_TARGET_DIR="$PWD/target" >/dev/null
      cmake --build "$build" >"$build.log" 2>&1 || { cat "$build.log"; exit 1; }
    )
    cmake --install "$build" --prefix "$tree/$name" >/dev/null
    check_arch "$arch" "$tree"
    tar -C "$tree" -czf "$out/$name.tar.gz" "$name"
    rm -rf "$tree"
  fi
done

# What is in DIR (what this run made and what an earlier run left), with its checksums.
(
  cd "$out"
  shopt -s nullglob
  made=(*.whl *.tar.gz)
  [ ${#made[@]} -gt 0 ] || { echo "!! nothing in $out" >&2; exit 1; }
  sha256sum -- "${made[@]}" > SHA256SUMS
  say "in $out:"
  for file in "${made[@]}"; do printf '  %10d  %s\n' "$(stat -c %s "$file")" "$file"; done
)
