"""A release wheel, imported as a user's program would: a NumPy round trip through it.

    python scripts/release_checks/round_trip.py [--from DIR] [--machine ARCH] [--torch]

`--from DIR`: the package (and NumPy) must be imported from under DIR (the clean venv, or the
unpacked aarch64 wheel); `--machine`: the interpreter runs on that architecture (`aarch64`
under qemu); `--torch`: PyTorch imports too (borrowed by the clean venv), and its file is shown.
Run by scripts/check-release.sh in a temporary working directory.
"""

from __future__ import annotations

import argparse
import platform
import sys

import numpy as np

import safetensors_staging
from safetensors_staging import _native
from safetensors_staging.numpy import load_file, save_file


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--from", dest="under", help="the package must be imported from under here")
    ap.add_argument("--machine", help="the architecture the interpreter must run on")
    ap.add_argument("--torch", action="store_true", help="PyTorch must import too")
    args = ap.parse_args()
    if args.under is not None:
        for module in (safetensors_staging, _native):
            assert module.__file__ is not None and module.__file__.startswith(args.under), (
                module.__file__,
                args.under,
            )
    if args.machine is not None:
        assert platform.machine() == args.machine, platform.machine()
    weights = {
        "a": np.arange(12, dtype=np.float32).reshape(3, 4),
        "b": np.array([1, 2], dtype=np.int64),
    }
    save_file(weights, "w.safetensors")
    loaded = load_file("w.safetensors")
    assert loaded.keys() == weights.keys()
    for name, array in weights.items():
        assert loaded[name].dtype == array.dtype and np.array_equal(loaded[name], array), name
    said = f"{platform.machine()} CPython {platform.python_version()}: round trip ok, {_native.__file__}"
    if args.torch:
        import torch

        said += f"; torch {torch.__version__} from {torch.__file__}"
    print(said)
    return 0


if __name__ == "__main__":
    sys.exit(main())
