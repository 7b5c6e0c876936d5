"""One event on a checkpoint file while tensors of it (or a handle on it) live, in this process:
run by `test_file_relation.py` (a child per case, since a mapped tensor of a truncated file kills
its process with SIGBUS).

    python file_events.py LIBRARY FRAMEWORK MAP HOW EVENT FILE

LIBRARY is `safetensors` or `staging`; FRAMEWORK `pt`, `np` or `flax`; MAP `default`, `true` or
`false` (the `map` keyword; only `default` for `safetensors`); HOW `load_file` (tensors loaded,
then the event) or `safe_open` (a handle opened, the event, then `get_tensor`); EVENT
`truncate`, `rewrite` (new bytes in place, same size), `rename` (a new file renamed over it) or
`save-back` (the loaded tensors saved to the same path). Prints what the tensors hold after it:
`unchanged` (the bytes of the file as loaded or opened), `changed`, or `error: CLASS`; then, for
`save-back`, whether the file then holds those bytes.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Dict

import numpy as np

N = 1 << 18


def original() -> Dict[str, np.ndarray]:
    values = np.arange(N, dtype=np.float32)
    return {"x": values, "y": values[::-1].copy()}


def as_numpy(value: Any) -> np.ndarray:
    return np.asarray(value.numpy() if hasattr(value, "detach") else value)


def same(loaded: Dict[str, Any]) -> bool:
    want = original()
    return all(np.array_equal(as_numpy(loaded[name]), want[name]) for name in want)


def event(name: str, path: str, module: Any, loaded: Dict[str, Any]) -> None:
    import safetensors.numpy

    if name == "truncate":
        os.truncate(path, 100)
    elif name == "rewrite":
        with open(path, "r+b") as f:
            f.seek(os.path.getsize(path) - 4 * N)
            f.write(np.zeros(N, np.float32).tobytes())
    elif name == "rename":
        zeros = {"x": np.zeros(N, np.float32), "y": np.zeros(N, np.float32)}
        safetensors.numpy.save_file(zeros, path + ".new")
        os.replace(path + ".new", path)
    elif name == "save-back":
        module.save_file(loaded, path)
    else:
        raise SystemExit(f"unknown event {name}")


def main() -> None:
    library, framework, mapping, how, name, path = sys.argv[1:7]
    import safetensors.numpy

    safetensors.numpy.save_file(original(), path)
    package = "safetensors" if library == "safetensors" else "safetensors_staging"
    submodule = {"pt": "torch", "np": "numpy", "flax": "flax"}[framework]
    module = importlib.import_module(f"{package}.{submodule}")
    options = {} if mapping == "default" else {"map": mapping == "true"}
    if how == "load_file":
        loaded = module.load_file(path, **options)
        event(name, path, module, loaded)
        print("unchanged" if same(loaded) else "changed")
        if name == "save-back":
            print("file holds them" if same(safetensors.numpy.load_file(path)) else "file differs")
        return
    opened = importlib.import_module(package).safe_open(path, framework=framework, **options)
    with opened as handle:
        event(name, path, module, {})
        try:
            loaded = {key: handle.get_tensor(key) for key in ("x", "y")}
        except Exception as error:  # what a handle raises is the outcome
            print(f"error: {type(error).__name__}")
            return
        print("unchanged" if same(loaded) else "changed")


if __name__ == "__main__":
    main()
