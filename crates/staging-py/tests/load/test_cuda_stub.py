"""The GPU path of the package on a machine without a GPU: the cuFile backend against the stub
`libcuda.so` and `libcufile.so.0` the Rust tests use (`crates/backend-cufile/stubs/`, compiled
here; system memory stands for device memory). What this checks is the package's part: that a
`device="cuda:0"` load goes to the cuFile backend, that each tensor is exported through DLPack as
CUDA memory of device 0 (`kDLCUDA`, the right dtype, shape and bytes), and that dropping the last
reference frees the allocation in the driver, in its own context, leaving the caller's current
context (here device 1's) current. It does not check torch adopting CUDA memory, which needs a GPU
(`scripts/gpu-check.sh`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, write_safetensors

# DLPack's structures, for the child scripts.
DLPACK_CTYPES = r"""
import ctypes
class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]
class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]
class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]
"""

CHILD = (
    DLPACK_CTYPES
    + r"""
import ctypes, json, sys
from safetensors_staging import _native
import safetensors_staging as st

get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
get_pointer.restype = ctypes.c_void_p
get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]

driver = ctypes.CDLL("libcuda.so")
driver.stub_cuda_live_allocation.restype = ctypes.c_size_t
driver.stub_cuda_live_allocation.argtypes = [ctypes.c_uint64]
driver.stub_cuda_wrong_context.restype = ctypes.c_size_t
driver.stub_cuda_set_devices.argtypes = [ctypes.c_long]

# The caller's current context is device 1's (as after torch.cuda.set_device(1)); the load is on
# device 0. It must still be device 1's after loading and after each tensor is freed.
driver.stub_cuda_set_devices(2)
driver.cuInit(0)
device1, caller = ctypes.c_int(), ctypes.c_void_p()
driver.cuDeviceGet(ctypes.byref(device1), 1)
driver.cuDevicePrimaryCtxRetain(ctypes.byref(caller), device1)
driver.cuCtxSetCurrent(caller)
def current():
    context = ctypes.c_void_p()
    driver.cuCtxGetCurrent(ctypes.byref(context))
    return context.value
moved = []
def check(when):
    if current() != caller.value:
        moved.append(when)

path = sys.argv[1]
# One allocation per tensor (no sub-allocation, no reading neighbours together), so that each
# tensor's own allocation can be watched in the driver.
it = _native._stage([path], device="cuda:0", backend="cufile", suballocate=False, coalesce_below=0,
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
    check(f"loading {name}")
    del staged  # the last reference: the memory goes back to the driver
    entry["live_after_drop"] = driver.stub_cuda_live_allocation(data) if data else None
    check(f"freeing {name}")
    seen.append(entry)
report = json.loads(it.report_json())
held = it.held()
# And with the defaults (small tensors carved from shared blocks, neighbours read together):
# once every tensor and the load are gone, the driver has all its memory back.
again = _native._stage([path], device="cuda:0", backend="cufile", cufile_mode=sys.argv[2])
tensors = [staged for _, staged in again]
free, total = ctypes.c_size_t(), ctypes.c_size_t()
driver.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
in_use_with_tensors = total.value - free.value
del tensors, again
check("freeing the second load's tensors")
driver.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
print(json.dumps({"tensors": seen, "backend": report["backend"], "mode": report["mode"], "held": held,
                  "in_use_with_tensors": in_use_with_tensors, "in_use_after": total.value - free.value,
                  "context_moved": moved, "wrong_context": driver.stub_cuda_wrong_context()}))
"""
)


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("stubs")
    source = REPO / "crates" / "backend-cufile" / "stubs"
    include = REPO / "crates" / "backend-gds" / "stubs"
    (out / "cuda").mkdir()
    (out / "cufile").mkdir()
    compile_ = [os.environ.get("CC", "cc"), "-shared", "-fPIC", "-O1", "-I", str(include)]
    subprocess.run(
        [
            *compile_,
            "-o",
            str(out / "cuda" / "libcuda.so"),
            str(source / "cuda_stub.c"),
            "-Wl,-soname,libcuda.so",
            "-lpthread",
        ],
        check=True,
    )
    subprocess.run(
        [
            *compile_,
            "-o",
            str(out / "cufile" / "libcufile.so.0"),
            str(source / "cufile_stub.c"),
            "-Wl,-soname,libcufile.so.0",
        ],
        check=True,
    )
    return {
        "LD_LIBRARY_PATH": str(out / "cuda"),
        "STAGING_CUFILE_LIB": str(out / "cufile" / "libcufile.so.0"),
    }


@pytest.mark.parametrize("mode", ["compat", "posix"])
def test_cuda_tensors_are_dlpack_cuda_exports_freed_by_their_last_reference(
    tmp_path: Path, stubs: dict, mode: str
) -> None:
    specs = [
        ("w", "BF16", (64, 32)),
        ("b", "F32", (7,)),
        ("f8", "F8_E4M3", (5, 3)),
        ("mask", "BOOL", (9,)),
    ]
    contents = write_safetensors(tmp_path / "model.safetensors", specs, seed=11)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path), mode],
        capture_output=True,
        text=True,
        env={**os.environ, **stubs},
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["backend"] == "cufile"
    assert result["mode"] == mode
    dtypes = {
        "w": [4, 16, 1],
        "b": [2, 32, 1],
        "f8": [10, 8, 1],
        "mask": [6, 8, 1],
    }  # kDLBfloat, kDLFloat, e4m3fn, kDLBool
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
    # The caller's current context (device 1's) was never moved, and nothing was freed in
    # another context than its own (the DLPack deleter runs wherever the last reference goes).
    assert result["context_moved"] == []
    assert result["wrong_context"] == 0


# A DLPack producer of CUDA memory written in Python (no GPU, no CUDA torch): its memory comes
# from the stub driver's cuMemAlloc (host memory there), and its `__dlpack__` records the stream
# the consumer asked for, as torch's does before ordering that stream after its own.
DESTINATION_CHILD = (
    DLPACK_CTYPES
    + r"""
import ctypes, json, sys
import safetensors_staging as st
from safetensors_staging import _native

driver = ctypes.CDLL("libcuda.so")
driver.stub_cuda_null_stream_syncs.restype = ctypes.c_size_t
driver.stub_cuda_live_allocation.restype = ctypes.c_size_t
driver.stub_cuda_live_allocation.argtypes = [ctypes.c_uint64]
driver.cuInit(0)
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
driver.cuDeviceGet(ctypes.byref(dev), 0)
driver.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
driver.cuCtxSetCurrent(ctx)

class Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]
DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
class Managed(ctypes.Structure):
    _fields_ = [("version", Version), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER),
                ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]
new_capsule = ctypes.pythonapi.PyCapsule_New
new_capsule.restype = ctypes.py_object
new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
deleted = []
@DELETER
def deleter(ptr):
    deleted.append(ptr)

class CudaArray:
    def __init__(self, nbytes, device_id=0, strides=None, read_only=False, lanes=1):
        self.ptr = ctypes.c_uint64()
        assert driver.cuMemAlloc_v2(ctypes.byref(self.ptr), nbytes) == 0
        ctypes.memset(self.ptr.value, 0, nbytes)
        self.nbytes, self.device_id, self.read_only, self.lanes = nbytes, device_id, read_only, lanes
        self.shape = (ctypes.c_int64 * 1)(nbytes)
        self.strides = None if strides is None else (ctypes.c_int64 * 1)(strides)
        self.streams = []
        self.managed = []
    def __dlpack_device__(self):
        return (2, self.device_id)  # kDLCUDA
    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        self.streams.append(stream)
        m = Managed()
        m.version = Version(1, 0)
        m.deleter = deleter
        m.flags = 1 if self.read_only else 0
        m.dl_tensor = DLTensor(self.ptr.value, DLDevice(2, self.device_id), 1, DLDataType(1, 8, self.lanes),
                               self.shape, self.strides, 0)
        self.managed.append(m)
        return new_capsule(ctypes.addressof(m), b"dltensor_versioned", None)
    def bytes(self):
        return ctypes.string_at(self.ptr.value, self.nbytes)

path, case = sys.argv[1], sys.argv[2]
made = {}
def destination(name, info):
    if name != "w":
        return None
    kwargs = {"bad_device": {"device_id": 1}, "strided": {"strides": 2}, "read_only": {"read_only": True},
              "lanes": {"lanes": 2}}.get(case, {})
    made[name] = CudaArray(info.nbytes, **kwargs)
    made["syncs_before"] = driver.stub_cuda_null_stream_syncs()
    return made[name]
try:
    it = _native._stage([path], device="cuda:0", backend="cufile", destination=destination, threads=1)
    got = dict(it)
    w = made["w"]
    print(json.dumps({"same_object": got["w"] is w, "bytes": w.bytes().hex(), "streams": w.streams,
                      "syncs": driver.stub_cuda_null_stream_syncs() - made["syncs_before"],
                      "deleted": len(deleted),
                      "path": [e["path"] for e in json.loads(it.report_json())["tensor_list"]
                               if e["name"] == "w"]}))
except st.StagingError as e:
    print(json.dumps({"error": type(e).__name__, "message": str(e), "deleted": len(deleted)}))
"""
)


@pytest.mark.parametrize("case", ["ok", "bad_device", "strided", "read_only", "lanes"])
def test_cuda_destinations_are_checked_and_synchronized_in_rust(
    tmp_path: Path, stubs: dict, case: str
) -> None:
    """A CUDA destination is taken through DLPack by the library itself: exported for the
    default stream (stream 1, which a producer such as torch orders after its current stream),
    that stream synchronized before the write, the memory kept alive (its DLPack deleter called)
    until the tensor is handed out; and device, contiguity, writability and dtype checked."""
    specs = [("w", "F32", (64,)), ("b", "F32", (7,))]
    contents = write_safetensors(tmp_path / "model.safetensors", specs, seed=5)
    out = subprocess.run(
        [sys.executable, "-c", DESTINATION_CHILD, str(tmp_path / "model.safetensors"), case],
        capture_output=True,
        text=True,
        env={**os.environ, **stubs},
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if case == "ok":
        assert result["same_object"], result
        assert bytes.fromhex(result["bytes"]) == contents["w"]
        assert result["path"] == ["destination"]
        assert result["streams"] == [1], "exported for the legacy default stream"
        assert result["syncs"] >= 1, "the default stream was synchronized before the write"
        assert result["deleted"] == 1, (
            "the DLPack tensor was released once the tensor was handed out"
        )
        return
    assert result["error"] == "DestinationError", result
    expected = {
        "bad_device": "the load is on cuda:0 but the destination is on cuda:1",
        "strided": "not contiguous",
        "read_only": "read-only",
        "lanes": "2 lanes",
    }[case]
    assert expected in result["message"], result["message"]
    assert 'tensor "w"' in result["message"], result["message"]
    assert result["deleted"] == 1, "a refused destination is released too"


OUT_OF_MEMORY_CHILD = r"""
import json, sys, torch
from safetensors_staging import _native
import safetensors_staging as st, safetensors_staging.torch as stt
big, small = sys.argv[1], sys.argv[2]
gpu = dict(device="cuda:0", backend="cufile", cufile_mode="compat")
out = {}
def handle(**more):
    with st.safe_open(big, "pt", **gpu, **more) as f:
        return f.get_tensor("big")
def sliced(**more):
    with st.safe_open(big, "pt", **gpu, **more) as f:
        return f.get_slice("big")[:]
def moved_by_torch():
    # safe_open keeps the policy (a slice of a tensor too large for the GPU needs it) and moves
    # a host-assembled tensor to the GPU: torch's allocator running out there, simulated (this
    # torch has no CUDA), is the same error.
    real = torch.Tensor.to
    def to(self, *args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 16.00 MiB")
    torch.Tensor.to = to
    try:
        return handle()
    finally:
        torch.Tensor.to = real
doors = [("torch.load_file", lambda: stt.load_file(big, **gpu)),
         ("load_file", lambda: st.load_file(big, **gpu)),
         ("memory_cap", lambda: stt.load_file(small, memory_cap="1MiB", **gpu)),
         ("safe_open", lambda: handle(host_assembly=False)),
         ("get_slice", lambda: sliced(host_assembly=False)),
         ("safe_open moved", moved_by_torch)]
import pickle
for door, call in doors:
    try:
        got = call()
        out[door] = {"handed_out": str(type(got))}
    except Exception as e:
        back = pickle.loads(pickle.dumps(e))
        out[door] = {"classes": [c.__name__ for c in type(e).__mro__],
                     "torch": isinstance(e, torch.OutOfMemoryError),
                     "ours": isinstance(e, st.OutOfMemoryError), "kind": e.kind, "message": str(e),
                     "pickled": type(back) is type(e) and str(back) == str(e)}
# The opt-in: stage()'s policy, the tensor assembled in host memory and handed out on the CPU.
opted = stt.load_file(big, host_assembly=True, **gpu)["big"]
out["opt_in"] = [str(opted.device), opted.view(torch.uint8).numpy().tobytes().hex()]
loaded = st.stage(big, **gpu)
dict(loaded.all())
out["stage_paths"] = {k: v["tensors"] for k, v in loaded.report()["paths"].items()}
# A tensor that fits only without the headroom: on the device without host assembly.
for host_assembly in (True, False):
    it = _native._stage([small], host_assembly=host_assembly, **gpu)
    out[f"small_{host_assembly}"] = [staged.path for _, staged in it]
print(json.dumps(out))
"""


def test_a_drop_in_load_on_a_gpu_is_on_the_gpu_or_raises_torchs_out_of_memory(
    tmp_path: Path, stubs: dict
) -> None:
    """Issue 57.11: `load_file(..., device="cuda")` and `safe_open` handed out CPU tensors where
    device memory ran short (the policy's host assembly), so a model loaded with
    `assign=True` ended split across devices. Now a tensor asked for on a GPU is on it, or the
    call raises an error that is both the library's `OutOfMemoryError` and
    `torch.OutOfMemoryError` (what `safetensors` raises there), and pickles; `host_assembly=True`
    opts `load_file` in to `stage()`'s policy, which `stage()` keeps; `memory_cap` still bounds
    the load. `safe_open` keeps the policy and moves a host-assembled tensor to the GPU (where
    torch's own out-of-memory error becomes the same class). The stub driver holds 8 MiB: a
    16 MiB tensor cannot be on it; a 4 MiB one fits, but not with the policy's 256 MiB
    headroom."""
    big = write_safetensors(tmp_path / "big.safetensors", [("big", "F32", (4 << 20,))], seed=3)
    write_safetensors(tmp_path / "small.safetensors", [("small", "F32", (1 << 20,))], seed=4)
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            OUT_OF_MEMORY_CHILD,
            str(tmp_path / "big.safetensors"),
            str(tmp_path / "small.safetensors"),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, **stubs, "STUB_CUDA_TOTAL_MIB": "8"},
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    for door in ("torch.load_file", "load_file", "memory_cap", "safe_open", "get_slice"):
        said = result[door]
        assert said.get("torch") and said.get("ours") and said["pickled"], (door, said)
        assert said["kind"] == "device-allocation", (door, said)
        assert ("small" if door == "memory_cap" else "big") in said["message"], (door, said)
    assert "memory_cap" in result["memory_cap"]["message"]
    moved = result["safe_open moved"]
    assert moved.get("torch") and moved.get("ours") and moved["pickled"], moved
    assert "CUDA out of memory" in moved["message"]
    assert result["opt_in"] == ["cpu", big["big"].hex()]
    assert result["stage_paths"]["host"] == 1 and result["stage_paths"]["device"] == 0
    assert result["small_True"] == ["host"] and result["small_False"] == ["device"]
