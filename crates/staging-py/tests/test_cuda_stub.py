"""The GPU path of the package on a machine without a GPU: the cuFile backend against the stub
`libcuda.so` and `libcufile.so.0` the Rust tests use (`crates/backend-cufile/stubs/`, compiled
here; system memory stands for device memory). What this checks is the package's part: that a
`device="cuda:0"` load goes to the cuFile backend, that each tensor is exported through DLPack as
CUDA memory of device 0 (`kDLCUDA`, the right dtype, shape and bytes), and that dropping the last
reference frees the allocation in the driver. It does not check torch adopting CUDA memory, which
needs a GPU (`scripts/gpu-check.sh`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, write_safetensors

CHILD = r"""
import ctypes, json, sys
from safetensors_staging import _native
import safetensors_staging as st

class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]
class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]
class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]
get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
get_pointer.restype = ctypes.c_void_p
get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]

driver = ctypes.CDLL("libcuda.so")
driver.stub_cuda_live_allocation.restype = ctypes.c_size_t
driver.stub_cuda_live_allocation.argtypes = [ctypes.c_uint64]

path = sys.argv[1]
# One allocation per tensor (no sub-allocation, no reading neighbours together), so that each
# tensor's own allocation can be watched in the driver.
it = _native._stage([path], gpu=0, backend_name="cufile", suballocate=False, coalesce_below=0,
                    cufile_mode=sys.argv[2])
seen = []
for name, staged in it:
    capsule = staged.__dlpack__()  # legacy ABI: the managed tensor starts with its DLTensor
    tensor = DLTensor.from_address(get_pointer(capsule, b"dltensor"))
    shape = [tensor.shape[i] for i in range(tensor.ndim)]
    data = tensor.data or 0
    entry = {
        "name": name, "space": staged.space, "path": staged.path,
        "device": [tensor.device.device_type, tensor.device.device_id],
        "dlpack_device": list(staged.__dlpack_device__()),
        "dtype": [tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes], "shape": shape,
        "bytes": ctypes.string_at(data, staged.nbytes).hex() if staged.nbytes else "",
        "live_while_held": driver.stub_cuda_live_allocation(data) if data else None,
    }
    del tensor, capsule  # a capsule nobody consumed: its destructor runs the deleter
    entry["live_after_capsule"] = driver.stub_cuda_live_allocation(data) if data else None
    del staged  # the last reference: the memory goes back to the driver
    entry["live_after_drop"] = driver.stub_cuda_live_allocation(data) if data else None
    seen.append(entry)
report = json.loads(it.report_json())
held = it.held()
# And with the defaults (small tensors carved from shared blocks, neighbours read together):
# once every tensor and the load are gone, the driver has all its memory back.
again = _native._stage([path], gpu=0, backend_name="cufile", cufile_mode=sys.argv[2])
tensors = [staged for _, staged in again]
free, total = ctypes.c_size_t(), ctypes.c_size_t()
driver.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
in_use_with_tensors = total.value - free.value
del tensors, again
driver.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
print(json.dumps({"tensors": seen, "backend": report["backend"], "mode": report["mode"], "held": held,
                  "in_use_with_tensors": in_use_with_tensors, "in_use_after": total.value - free.value}))
"""


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("stubs")
    source = REPO / "crates" / "backend-cufile" / "stubs"
    include = REPO / "crates" / "backend-gds" / "stubs"
    (out / "cuda").mkdir()
    (out / "cufile").mkdir()
    compile_ = [os.environ.get("CC", "cc"), "-shared", "-fPIC", "-O1", "-I", str(include)]
    subprocess.run([*compile_, "-o", str(out / "cuda" / "libcuda.so"), str(source / "cuda_stub.c"),
                    "-Wl,-soname,libcuda.so", "-lpthread"], check=True)
    subprocess.run([*compile_, "-o", str(out / "cufile" / "libcufile.so.0"), str(source / "cufile_stub.c"),
                    "-Wl,-soname,libcufile.so.0"], check=True)
    return {"LD_LIBRARY_PATH": str(out / "cuda"), "STAGING_CUFILE_LIB": str(out / "cufile" / "libcufile.so.0")}


@pytest.mark.parametrize("mode", ["compat", "posix"])
def test_cuda_tensors_are_dlpack_cuda_exports_freed_by_their_last_reference(tmp_path: Path, stubs: dict, mode: str) -> None:
    specs = [("w", "BF16", (64, 32)), ("b", "F32", (7,)), ("f8", "F8_E4M3", (5, 3)), ("mask", "BOOL", (9,))]
    contents = write_safetensors(tmp_path / "model.safetensors", specs, seed=11)
    out = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), mode], capture_output=True, text=True,
                         env={**os.environ, **stubs}, timeout=60)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["backend"] == "cufile"
    assert result["mode"] == mode
    dtypes = {"w": [4, 16, 1], "b": [2, 32, 1], "f8": [10, 8, 1], "mask": [6, 8, 1]}  # kDLBfloat, kDLFloat, e4m3fn, kDLBool
    assert [t["name"] for t in result["tensors"]] == [s[0] for s in specs]
    for t, (name, _, shape) in zip(result["tensors"], specs):
        assert (t["space"], t["path"]) == ("cuda", "device"), t
        assert t["device"] == t["dlpack_device"] == [2, 0], t  # kDLCUDA, device 0
        assert t["dtype"] == dtypes[name] and t["shape"] == list(shape), t
        assert bytes.fromhex(t["bytes"]) == contents[name], name
        assert t["live_while_held"] >= len(contents[name])
        assert t["live_after_capsule"] == t["live_while_held"], "the tensor still holds it"
        assert t["live_after_drop"] == 0, "the last reference freed it in the driver"
    assert result["held"] == {"device": 0, "host": 0, "caller": 0}
    assert result["in_use_with_tensors"] >= sum(map(len, contents.values()))
    assert result["in_use_after"] == 0
