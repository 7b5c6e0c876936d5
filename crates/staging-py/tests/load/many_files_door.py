"""Loads a checkpoint through one door, in this process (run by `test_descriptors.py` under a
low descriptor limit), and prints the SHA-256 of every tensor's bytes, in name order, with the
most descriptors the process held at once and the most mappings of the checkpoint's files
(both sampled at every tensor), and the mappings left once every tensor is dropped.

    python many_files_door.py DOOR CHECKPOINT [C_LIBRARY]

DOOR is `load_file` (torch, `map` at its default), `load_file-map-false`, `stage` (torch,
sampled at every tensor), `numpy` (`numpy.load_file`), `safe_open`, `safe_open-map-false` or
`c` (the C ABI through ctypes, with C_LIBRARY).
"""

from __future__ import annotations

import ctypes
import gc
import hashlib
import os
import sys
from typing import Dict, Iterator, Tuple

most = 0
most_mapped = 0


def mappings(checkpoint: str) -> int:
    """The mappings of the checkpoint's files this process holds."""
    prefix = (os.path.realpath(checkpoint) + "/").encode()
    with open("/proc/self/maps", "rb") as maps:
        return maps.read().count(prefix)


def sample(checkpoint: str) -> None:
    global most, most_mapped
    most = max(most, len(os.listdir("/proc/self/fd")))
    most_mapped = max(most_mapped, mappings(checkpoint))


def torch_bytes(tensor: object) -> bytes:
    import torch

    assert isinstance(tensor, torch.Tensor)
    return tensor.contiguous().view(torch.uint8).numpy().tobytes()


class Info(ctypes.Structure):
    """`struct stg_tensor_info`."""

    _fields_ = [
        ("name", ctypes.c_char_p),
        ("dtype", ctypes.c_char_p),
        ("shape", ctypes.POINTER(ctypes.c_uint64)),
        ("ndim", ctypes.c_size_t),
        ("bytes", ctypes.c_size_t),
        ("file", ctypes.c_char_p),
        ("file_offset", ctypes.c_uint64),
        ("path", ctypes.c_uint32),
        ("data", ctypes.c_void_p),
        ("dtype_id", ctypes.c_uint32),
        ("dtype_bits", ctypes.c_uint32),
    ]


def through_c(library: str, checkpoint: str) -> Iterator[Tuple[str, bytes]]:
    lib = ctypes.CDLL(library)
    vp = ctypes.c_void_p
    lib.stg_config_new.argtypes = [ctypes.POINTER(vp)]
    lib.stg_config_set.argtypes = [vp, ctypes.c_char_p, ctypes.c_char_p]
    lib.stg_load_new.argtypes = [vp, ctypes.c_char_p, ctypes.POINTER(vp)]
    lib.stg_load_next.argtypes = [vp, ctypes.POINTER(vp)]
    lib.stg_tensor_describe.argtypes = [vp, ctypes.POINTER(Info)]
    lib.stg_tensor_copy_to_host.argtypes = [vp, ctypes.c_void_p, ctypes.c_size_t]
    lib.stg_tensor_free.argtypes = [vp]
    lib.stg_load_last_error.argtypes = [vp, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p]
    lib.stg_load_free.argtypes = [vp]
    lib.stg_config_free.argtypes = [vp]
    config, load = vp(), vp()
    assert lib.stg_config_new(ctypes.byref(config)) == 0
    assert lib.stg_config_set(config, b"device", b"cpu") == 0
    status = lib.stg_load_new(config, checkpoint.encode(), ctypes.byref(load))
    assert status == 0, f"stg_load_new: status {status}"
    try:
        yield from c_tensors(lib, load)
    finally:
        lib.stg_load_free(load)
        lib.stg_config_free(config)


def c_tensors(lib: ctypes.CDLL, load: ctypes.c_void_p) -> Iterator[Tuple[str, bytes]]:
    vp = ctypes.c_void_p
    while True:
        tensor = vp()
        status = lib.stg_load_next(load, ctypes.byref(tensor))
        if status == 1:  # STG_END
            return
        if status != 0:
            message = ctypes.create_string_buffer(4096)
            lib.stg_load_last_error(load, message, len(message), None)
            raise SystemExit(f"stg_load_next: status {status}: {message.value.decode()}")
        info = Info()
        assert lib.stg_tensor_describe(tensor, ctypes.byref(info)) == 0
        out = ctypes.create_string_buffer(info.bytes)
        assert lib.stg_tensor_copy_to_host(tensor, out, info.bytes) == 0
        yield info.name.decode(), out.raw
        lib.stg_tensor_free(tensor)


def tensors(door: str, checkpoint: str) -> Iterator[Tuple[str, bytes]]:
    import safetensors_staging as st

    if door in ("load_file", "load_file-map-false"):
        options = {"map": False} if door.endswith("false") else {}
        for name, tensor in st.load_file(checkpoint, **options).items():
            yield name, torch_bytes(tensor)
    elif door == "stage":
        with st.stage(checkpoint) as loaded:
            for name, tensor in loaded:
                yield name, torch_bytes(tensor)
    elif door == "numpy":
        import safetensors_staging.numpy as stn

        for name, array in stn.load_file(checkpoint, unsupported_dtypes="uint8").items():
            yield name, array.tobytes()
    elif door in ("safe_open", "safe_open-map-false"):
        options = {"map": False} if door.endswith("false") else {}
        with st.safe_open(checkpoint, framework="pt", **options) as handle:
            for name in handle.keys():
                yield name, torch_bytes(handle.get_tensor(name))
    else:
        raise SystemExit(f"unknown door {door}")


def main() -> None:
    door, checkpoint = sys.argv[1:3]
    got: Dict[str, str] = {}
    loaded = through_c(sys.argv[3], checkpoint) if door == "c" else tensors(door, checkpoint)
    for name, data in loaded:
        got[name] = hashlib.sha256(data).hexdigest()
        sample(checkpoint)
    del loaded, data
    gc.collect()
    for name in sorted(got):
        print(name, got[name])
    print("most mappings", most_mapped)
    print("mappings left", mappings(checkpoint))
    print("most descriptors", most)


if __name__ == "__main__":
    main()
