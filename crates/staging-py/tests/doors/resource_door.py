"""Starts a load that needs I/O threads in a process the system refuses threads to (run by
`test_resources.py`), through one door, and prints what the door said, as JSON.

    python resource_door.py DOOR REFUSAL CHECKPOINT [C_LIBRARY]

DOOR is `python` (`load_file`), `safe_open` (every tensor, in order: the handle reads ahead
on a thread of its own) or `c` (the C ABI through ctypes, with C_LIBRARY); each asks for 64
I/O threads and reads into memory of its own (`map=false`), which is what starts them; or
`url` (`load_file` of an `http://` URL, whose I/O runtime starts threads before any request).
REFUSAL is what is refused, set up once everything is imported: `nproc`, threads by the limit
on processes and threads (`RLIMIT_NPROC` of 1; as root, which it does not bind, the process
becomes `nobody` first); `address-space`, threads by an address space with no room for their
stacks (what an exhausted map count does too); or `nofile`, descriptors (`RLIMIT_NOFILE` at
the number open now).
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import sys

NOBODY = 65534


def refuse_threads(how: str) -> None:
    if how == "nofile":
        open_now = len(os.listdir("/proc/self/fd")) - 1  # less the listing's own
        resource.setrlimit(resource.RLIMIT_NOFILE, (open_now, open_now))
        return
    if how == "nproc":
        resource.setrlimit(resource.RLIMIT_NPROC, (1, 1))
        if os.geteuid() == 0:
            os.setgid(NOBODY)
            os.setuid(NOBODY)
        return
    # 1 MiB of address space left: less than one thread's stack (a Rust thread's is 2 MiB, and
    # the pool's threads take that default: `refused` clears RUST_MIN_STACK), so the first
    # thread is refused and none runs. With room for a few (48 MiB, 24 before), a thread that
    # did start could find the rest taken by its siblings' stacks and arenas and abort on a small
    # allocation of its own: glibc's "failed to register TLS destructor: out of memory", or
    # Rust's "memory allocation of 9 bytes failed", one run in 40 of the `safe_open` door
    # (2026-12-07). The loading thread's own allocations (the error, its Python exception) fit
    # in what is left.
    with open("/proc/self/status") as status:
        size = next(int(line.split()[1]) for line in status if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (size * 1024 + (1 << 20), resource.RLIM_INFINITY))


def main() -> None:
    door, how, checkpoint = sys.argv[1:4]
    if door == "c":
        lib = ctypes.CDLL(sys.argv[4])
        vp = ctypes.c_void_p
        lib.stg_config_new.argtypes = [ctypes.POINTER(vp)]
        lib.stg_config_set.argtypes = [vp, ctypes.c_char_p, ctypes.c_char_p]
        lib.stg_config_last_error.argtypes = [
            vp,
            ctypes.c_char_p,
            ctypes.c_size_t,
            ctypes.POINTER(ctypes.c_size_t),
        ]
        lib.stg_load_new.argtypes = [vp, ctypes.c_char_p, ctypes.POINTER(vp)]
        lib.stg_status_str.restype = ctypes.c_char_p
        config, load = vp(), vp()
        assert lib.stg_config_new(ctypes.byref(config)) == 0
        for key, value in ((b"map", b"false"), (b"threads", b"64"), (b"device", b"cpu")):
            assert lib.stg_config_set(config, key, value) == 0
        refuse_threads(how)
        status = lib.stg_load_new(config, checkpoint.encode(), ctypes.byref(load))
        message = ctypes.create_string_buffer(4096)
        written = ctypes.c_size_t()
        lib.stg_config_last_error(config, message, len(message), ctypes.byref(written))
        print(
            json.dumps(
                {
                    "status": status,
                    "status_str": lib.stg_status_str(status).decode(),
                    "message": message.value.decode(),
                }
            )
        )
        return
    import torch  # noqa: F401  (imported before the refusal: loading it maps a lot)

    import safetensors_staging as st

    refuse_threads(how)
    try:
        if door == "python":
            st.load_file(checkpoint, map=False, threads=64)
        elif door == "url":
            st.load_file("http://127.0.0.1:9/model.safetensors")
        else:
            with st.safe_open(checkpoint, framework="np", map=False, threads=64) as handle:
                for name in handle.offset_keys():
                    handle.get_tensor(name)
    except Exception as error:
        print(
            json.dumps(
                {
                    "class": type(error).__name__,
                    "mro": [c.__name__ for c in type(error).__mro__],
                    "kind": getattr(error, "kind", None),
                    "errno": getattr(error, "errno", None),
                    "message": str(error),
                }
            )
        )
        return
    print(json.dumps({"loaded": True}))


if __name__ == "__main__":
    main()
