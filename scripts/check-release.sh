#!/usr/bin/env bash
# The release artefacts (scripts/release.sh) installed and run as a user would, with no Rust.
#
#   scripts/check-release.sh [--strict] [--dist DIR] [--borrow VENV] [--aarch64-python DIR]
#
# x86_64 (this machine):
#   - the wheel goes into a new venv by pip, on a PATH that holds the venv and nothing else (no
#     cargo, rustc, cc: checked), with PIP_ONLY_BINARY=:all: and no pip cache, timed (its
#     dependency, NumPy, comes from PyPI as a user's would); its size is checked (<= 8 MB);
#   - NumPy round trip in that venv; then, with the packages of VENV (--borrow: PyTorch,
#     safetensors, transformers; several GB a user already has) appended to its path by a .pth
#     file after the install, the README's Python blocks and the drop-in guide's run in it (the
#     package imported is checked to be the venv's own);
#   - `stage` from its tarball runs --demo; a C program is built against the C tarball with
#     pkg-config, statically and against the shared library, and run.
# aarch64 (no such machine here):
#   - every ELF file of the wheel and the tarballs: its machine (readelf), the libraries it needs
#     (the C library, libm, libgcc_s and the like: nothing else), the newest glibc symbol version
#     it asks for (<= 2.28), its exported entry points (PyInit__native, stg_*), sizes;
#   - under user-mode emulation, where qemu-aarch64 and an aarch64 glibc are installed
#     (Debian: qemu-user, libc6-arm64-cross, libgcc-s1-arm64-cross): `stage --demo`, and the C
#     program built with zig for aarch64 against the C tarball, static and shared; with
#     --aarch64-python DIR (an aarch64 CPython and NumPy, made by .ci/aarch64-python.sh), the
#     aarch64 wheel imported by that Python and a NumPy round trip run through it.
# Prints what ran and what did not; exits non-zero on any failure, and with --strict (CI) when
# anything was not run.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

dist=target/dist
borrow=""
a64_python=""
strict=0
while [ $# -gt 0 ]; do
  case "$1" in
    --dist) dist=$2; shift 2 ;;
    --borrow) borrow=$2; shift 2 ;;
    --aarch64-python) a64_python=$2; shift 2 ;;
    --strict) strict=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
dist=$(cd "$dist" && pwd)
version=$(sed -n 's/^version = "\([0-9.]*\)"$/\1/p' Cargo.toml | head -n 1)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

say() { echo "$(date +%T) -- $*"; }
fail() { echo "!! $*" >&2; exit 1; }
one() { # the one file matching a glob, or fail
  local found=("$@")
  [ ${#found[@]} -eq 1 ] && [ -f "${found[0]}" ] || fail "expected one file, found: ${found[*]}"
  echo "${found[0]}"
}
not_run=()

# --- x86_64: the wheel, installed with no Rust and no compiler -----------------------------------

wheel=$(one "$dist"/safetensors_staging-"$version"-cp39-abi3-manylinux_2_*_x86_64.whl)
size=$(stat -c %s "$wheel")
echo "x86_64 wheel: $(basename "$wheel"), $size bytes"
[ "$size" -le $((8 * 1000 * 1000)) ] || fail "the wheel is over 8 MB"

say "a new venv; pip install the wheel on a PATH with no compiler"
python3 -m venv "$work/venv"
clean_path="$work/venv/bin"
for tool in cargo rustc rustup cc gcc c++ clang zig ld; do
  if PATH=$clean_path command -v "$tool" >/dev/null; then fail "$tool is on the clean PATH"; fi
done
start=$(date +%s%N)
PATH=$clean_path PIP_ONLY_BINARY=:all: PIP_NO_CACHE_DIR=1 \
  "$work/venv/bin/pip" install --quiet --disable-pip-version-check "$wheel"
took_ms=$((($(date +%s%N) - start) / 1000000))
echo "installed in $((took_ms / 1000)).$(printf %03d $((took_ms % 1000))) s (with NumPy from PyPI, no cache)"
[ "$took_ms" -le 10000 ] || echo "!! over the 10 s goal (reported, not failed: the network's speed is not the wheel's)"

say "NumPy round trip in the clean venv"
(cd "$work" && PATH=$clean_path "$work/venv/bin/python" "$root/scripts/release_checks/round_trip.py" --from "$work/venv")

if [ -n "$borrow" ]; then
  say "the README's and the drop-in guide's Python blocks, in the clean venv (PyTorch borrowed from $borrow)"
  site=$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  borrowed=$("$borrow/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  # After the venv's own site-packages on sys.path: the venv's package and NumPy come first.
  echo "$borrowed" > "$site/zz_borrowed.pth"
  (cd "$work" && PATH=$clean_path "$work/venv/bin/python" "$root/scripts/release_checks/round_trip.py" --from "$work/venv" --torch)
  PATH=$clean_path "$work/venv/bin/python" .ci/docs_blocks.py --only python README.md docs/guides/drop-in.md \
    | tee "$work/blocks.txt"
  # The README's block and the guide's two: a run that found none would pass vacuously.
  ran=$(sed -n 's/^docs blocks: \([0-9]*\) run.*/\1/p' "$work/blocks.txt")
  [ "${ran:-0}" -ge 3 ] || fail "only ${ran:-0} Python blocks ran"
else
  not_run+=("the README's and drop-in guide's Python blocks (no --borrow VENV with PyTorch)")
fi

# --- x86_64: stage and the C library from their tarballs -----------------------------------------

for arch in x86_64 aarch64; do
  mkdir -p "$work/$arch"
  tar -C "$work/$arch" -xzf "$(one "$dist/stage-$version-$arch-linux-gnu.tar.gz")"
  tar -C "$work/$arch" -xzf "$(one "$dist/staging-ffi-$version-$arch-linux-gnu.tar.gz")"
  mkdir -p "$work/$arch/wheel"
  python3 -m zipfile -e "$(one "$dist"/safetensors_staging-"$version"-cp39-abi3-manylinux_2_*_"$arch".whl)" "$work/$arch/wheel"
done
x86_stage="$work/x86_64/stage-$version-x86_64-linux-gnu/bin/stage"
x86_ffi="$work/x86_64/staging-ffi-$version-x86_64-linux-gnu"

say "x86_64: stage --demo from its tarball"
"$x86_stage" --demo --synthetic-size 64MiB | tail -n 2

say "x86_64: a C program against the C tarball (pkg-config), static and shared"
pc() { PKG_CONFIG_PATH="$1/lib/pkgconfig" pkg-config "${@:2}" staging_ffi; }
# shellcheck disable=SC2046 # pkg-config's flags are words
cc -std=c11 -Wall -Werror crates/staging-ffi/tests/pkgconfig.c -o "$work/c-static" \
  $(pc "$x86_ffi" --cflags --libs --static | sed 's/-lstaging_ffi/-l:libstaging_ffi.a/')
# shellcheck disable=SC2046
cc -std=c11 -Wall -Werror crates/staging-ffi/tests/pkgconfig.c -o "$work/c-shared" \
  $(pc "$x86_ffi" --cflags --libs) -Wl,-rpath,"$x86_ffi/lib"
"$work/c-static"
"$work/c-shared"
# (Each readelf's output is taken whole before grep reads it: a grep -q that stops early at the
# end of a pipeline could give readelf a SIGPIPE, and with pipefail a wrong answer.)
dynamic=$(readelf -d "$work/c-static")
if grep -q 'libstaging_ffi\.so' <<< "$dynamic"; then fail "the static program needs libstaging_ffi.so"; fi

# --- every architecture: the ELF files' facts ----------------------------------------------------

elf_facts() { # arch file: machine, needed libraries, newest glibc version, size
  local arch=$1 file=$2 machine needed glibc allowed
  machine=$(readelf -h "$file" | sed -n 's/^ *Machine: *//p' | sort -u)
  case "$arch" in x86_64) [ "$machine" = "Advanced Micro Devices X86-64" ] ;; aarch64) [ "$machine" = "AArch64" ] ;; esac \
    || fail "$file: machine '$machine', not $arch"
  if [[ "$file" == *.a ]]; then
    echo "  $(basename "$file"): $machine objects, $(stat -c %s "$file") bytes"
    return
  fi
  needed=$(readelf -d "$file" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p' | tr '\n' ' ')
  allowed='^(libc\.so\.6|libm\.so\.6|libgcc_s\.so\.1|libpthread\.so\.0|libdl\.so\.2|librt\.so\.1|libutil\.so\.1|ld-linux-(aarch64|x86-64)\.so\.[12])$'
  for lib in $needed; do
    [[ "$lib" =~ $allowed ]] || fail "$file needs $lib (outside glibc and libgcc)"
  done
  glibc=$(readelf -W --dyn-syms "$file" | { grep -o 'GLIBC_[0-9.]*' || true; } | sed 's/GLIBC_//' | sort -V | tail -n 1)
  [ -n "$glibc" ] || fail "$file asks for no versioned glibc symbol (not linked against glibc?)"
  [ "$(printf '%s\n2.28\n' "$glibc" | sort -V | tail -n 1)" = "2.28" ] || fail "$file asks for glibc $glibc (> 2.28)"
  echo "  $(basename "$file"): $machine, needs [$needed], glibc <= $glibc, $(stat -c %s "$file") bytes"
}

for arch in x86_64 aarch64; do
  say "$arch: the artefacts' ELF files"
  ext=$(one "$work/$arch/wheel/safetensors_staging"/_native*.so)
  ffi="$work/$arch/staging-ffi-$version-$arch-linux-gnu"
  for file in "$ext" "$work/$arch/stage-$version-$arch-linux-gnu/bin/stage" "$ffi/lib/libstaging_ffi.so" "$ffi/lib/libstaging_ffi.a"; do
    elf_facts "$arch" "$file"
  done
  symbols=$(readelf -W --dyn-syms "$ext")
  grep -q ' PyInit__native$' <<< "$symbols" || fail "$ext exports no PyInit__native"
  exported=$(readelf -W --dyn-syms "$ffi/lib/libstaging_ffi.so" | awk '$7 != "UND" && $8 ~ /^stg_/' | wc -l)
  [ "$exported" -gt 20 ] || fail "$ffi/lib/libstaging_ffi.so exports $exported stg_ functions"
  echo "  libstaging_ffi.so exports $exported stg_ functions; the extension exports PyInit__native"
  if command -v file >/dev/null; then file -b "$ext" | sed 's/^/  file: /'; fi
done

# --- aarch64 under user-mode emulation -----------------------------------------------------------

sysroot=/usr/aarch64-linux-gnu
if command -v qemu-aarch64 >/dev/null && [ -e "$sysroot/lib/ld-linux-aarch64.so.1" ]; then
  a64_stage="$work/aarch64/stage-$version-aarch64-linux-gnu/bin/stage"
  a64_ffi="$work/aarch64/staging-ffi-$version-aarch64-linux-gnu"
  say "aarch64 (qemu-aarch64 $(qemu-aarch64 --version | head -n 1 | awk '{print $3}')): stage --demo"
  qemu-aarch64 -L "$sysroot" "$a64_stage" --demo --synthetic-size 64MiB | tail -n 2
  say "aarch64 (qemu): a C program built with zig against the C tarball, static and shared"
  zig=("$root/target/release-tools/bin/python" -m ziglang cc -target aarch64-linux-gnu.2.28)
  [ -x "$root/target/release-tools/bin/python" ] || fail "no target/release-tools (scripts/release.sh makes it)"
  # zig has LLVM's libunwind where a GNU toolchain has libgcc_s (the .pc names the latter).
  # shellcheck disable=SC2046
  "${zig[@]}" -std=c11 -Wall -Werror crates/staging-ffi/tests/pkgconfig.c -o "$work/a64-static" \
    $(pc "$a64_ffi" --cflags --libs --static | sed 's/-lstaging_ffi/-l:libstaging_ffi.a/; s/-lgcc_s/-lunwind/')
  # shellcheck disable=SC2046
  "${zig[@]}" -std=c11 -Wall -Werror crates/staging-ffi/tests/pkgconfig.c -o "$work/a64-shared" \
    $(pc "$a64_ffi" --cflags --libs)
  qemu-aarch64 -L "$sysroot" "$work/a64-static"
  qemu-aarch64 -L "$sysroot" -E LD_LIBRARY_PATH="$a64_ffi/lib" "$work/a64-shared"
  if [ -n "$a64_python" ]; then
    a64_python=$(cd "$a64_python" && pwd)
    a64_py=(qemu-aarch64 -L "$a64_python/root" "$a64_python/root/usr/bin/python3.11")
    say "aarch64 (qemu): the wheel imported by CPython $(PYTHONHOME=/usr "${a64_py[@]}" -c 'import platform; print(platform.python_version())'), a NumPy round trip"
    (cd "$work" && PYTHONHOME=/usr PYTHONPATH="$work/aarch64/wheel:$a64_python/site" \
      "${a64_py[@]}" "$root/scripts/release_checks/round_trip.py" --from "$work/aarch64/wheel" --machine aarch64)
  else
    not_run+=("the aarch64 wheel under an aarch64 Python (no --aarch64-python DIR: checked as files only)")
  fi
else
  not_run+=("aarch64 under emulation (install qemu-user, libc6-arm64-cross and libgcc-s1-arm64-cross)")
  not_run+=("the aarch64 wheel under an aarch64 Python (no qemu-aarch64)")
fi

say "done; not run: ${#not_run[@]}"
for what in "${not_run[@]}"; do echo "  NOT RUN: $what"; done
[ "$strict" -eq 0 ] || [ ${#not_run[@]} -eq 0 ] || fail "--strict: ${#not_run[@]} check(s) not run"
