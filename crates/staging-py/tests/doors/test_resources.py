"""A load the system refuses threads to fails with a resource error naming the limit, in every
door: Python's `ResourceError` (an `OSError`, `errno` the system's code), C's `STG_RESOURCE`,
`stage`'s kind `resource`. It used to be `InvalidOptionError: invalid staging policy`, a
`ValueError`, as if the options were wrong. Each case runs in a child process refused threads:
by the limit on processes and threads (`RLIMIT_NPROC`, with the child as an unprivileged user,
since root is exempt), or by an address space with no room for their stacks."""

from __future__ import annotations

import errno
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest

from conftest import write_safetensors

SCRIPT = Path(__file__).with_name("resource_door.py")
NOBODY = 65534
HINT = "the system refused another thread"


@pytest.fixture(scope="module")
def shared() -> Iterator[Path]:
    """A checkpoint another user may read (the child runs as `nobody`): in a directory of its
    own under the system's temporary directory, not pytest's, whose root (`pytest-of-<user>`)
    is 0700 and which any other pytest run of the same user makes 0700 again when it starts."""
    directory = Path(tempfile.mkdtemp(prefix="staging-resources-"))
    try:
        # Two tensors: a handle reading them in order reads the second ahead, on a thread.
        path = directory / "model.safetensors"
        write_safetensors(path, [("v", "F32", (8,)), ("w", "F32", (64, 64))])
        for each in (directory, path):
            os.chmod(each, 0o755)
        yield path
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def no_more_threads() -> None:
    resource.setrlimit(resource.RLIMIT_NPROC, (1, 1))
    if os.geteuid() == 0:  # root is exempt from RLIMIT_NPROC: run as nobody
        os.setgid(NOBODY)
        os.setuid(NOBODY)


def refused(command: List[str], preexec: Any = None) -> Tuple[int, str]:
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(SCRIPT.parent), env.get("PYTHONPATH", "")])
    env.pop("RUST_MIN_STACK", None)  # threads take their default stack (resource_door.py)
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=300, env=env, preexec_fn=preexec
    )
    return done.returncode, done.stdout if done.stdout else done.stderr


def python_says(door: str, checkpoint: Path, by: str, *more: str) -> Dict[str, Any]:
    code, out = refused([sys.executable, str(SCRIPT), door, by, str(checkpoint), *more])
    assert code == 0, out
    return json.loads(out)


@pytest.mark.parametrize("by", ["nproc", "address-space"])
@pytest.mark.parametrize("door", ["python", "safe_open"])
def test_python_raises_a_resource_error_naming_the_limit(shared: Path, door: str, by: str) -> None:
    said = python_says(door, shared, by)
    assert said["class"] == "ResourceError", said
    assert {"StagingError", "OSError"} <= set(said["mro"]) and "ValueError" not in said["mro"]
    assert said["kind"] == "resource" and said["errno"] == errno.EAGAIN
    assert said["message"].startswith("cannot start 64 I/O threads: resource temporarily")
    assert HINT in said["message"]


def test_a_url_whose_runtime_cannot_start_raises_a_resource_error(shared: Path) -> None:
    # The remote I/O runtime's threads: tokio panics when the system refuses one; said as
    # the resource error it is.
    said = python_says("url", shared, "nproc")
    assert said["class"] == "ResourceError" and said["errno"] == errno.EAGAIN, said
    assert said["message"].startswith("cannot start the I/O runtime's 2 threads")


@pytest.mark.parametrize("door", ["python", "safe_open"])
def test_no_descriptor_left_is_a_resource_error(shared: Path, door: str) -> None:
    said = python_says(door, shared, "nofile")
    assert said["class"] == "ResourceError" and said["errno"] == errno.EMFILE, said
    assert "too many open files" in said["message"]


@pytest.mark.parametrize("by", ["nproc", "address-space"])
def test_c_returns_stg_resource(shared: Path, other_doors: Tuple[Path, Path], by: str) -> None:
    said = python_says("c", shared, by, str(other_doors[1]))
    assert said["status"] == 850, said  # STG_RESOURCE
    assert said["status_str"].startswith("the system refused a resource")
    assert said["message"].startswith("cannot start 64 I/O threads") and HINT in said["message"]


def test_stage_says_kind_resource(shared: Path, stage_bin: Path) -> None:
    # The unprivileged child runs a copy of `stage` beside the checkpoint: the checkout may sit
    # in a directory `nobody` cannot enter (root's home, a `mktemp -d` folder).
    runnable = shared.parent / "stage"
    shutil.copy2(stage_bin, runnable)
    os.chmod(runnable, 0o755)
    command = [str(runnable), str(shared), "--map", "false", "--threads", "64"]
    code, out = refused([*command, "--json"], no_more_threads)
    assert code == 1
    error = json.loads(out)["error"]
    assert error["kind"] == "resource" and error["message"].startswith("cannot start 64 I/O")
    code, out = refused(command, no_more_threads)
    assert code == 1 and out.startswith("stage: error: cannot start 64 I/O threads") and HINT in out


def test_a_load_that_needs_no_threads_still_runs(shared: Path) -> None:
    # A mapped load starts no thread: refused threads, it loads.
    script = (
        "import safetensors_staging as st, torch, resource_door as door; "
        f"door.refuse_threads('nproc'); w = st.load_file({str(shared)!r})['w']; "
        "print(w.view(torch.uint8).numpy().tobytes().hex())"
    )
    code, out = refused([sys.executable, "-c", script], None)
    assert code == 0, out
    assert bytes.fromhex(out.strip()) == shared.read_bytes()[-64 * 64 * 4 :]
