"""Bad input, memory over many loads, Ctrl-C, the GIL, the progress bar."""

from __future__ import annotations

import gc
import json
import os
import pty
import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Dict, List

import pytest
import torch

import safetensors_staging as st
from safetensors_staging import _native

from conftest import STALLING_SERVER, write_safetensors

ZERO = {"device": 0, "host": 0, "caller": 0}


def test_malformed_raises_staging_error_with_the_cli_message(
    malformed: Dict[str, List[Path]], stage_bin: Path
) -> None:
    """Every malformed checkpoint the Rust suite knows: one `StagingError` (never a crash, never
    a partial result), with the very line `stage` prints."""
    for case, paths in malformed.items():
        with pytest.raises(st.StagingError) as caught:
            st.load_file(paths, backend="host")
        expected = (
            st.PathNotFoundError if case == "nonexistent_path" else st.MalformedCheckpointError
        )
        assert type(caught.value) is expected, (case, caught.value)
        cli = subprocess.run(
            [str(stage_bin), "--backend", "host", *map(str, paths)], capture_output=True, text=True
        )
        assert cli.returncode == 1, case
        assert cli.stderr.strip() == f"stage: error: {caught.value}", case


def test_read_error_mid_load_hands_out_nothing_half_read(tmp_path: Path) -> None:
    """A file cut short after its header was checked: a `ReadError` naming the file and what
    changed, before any tensor is handed out; nothing is held after. (Read errors from the
    reader itself, naming tensor and offset, are injected by the Rust suite.)"""
    write_safetensors(
        tmp_path / "model.safetensors", [("a", "F32", (256,)), ("b", "F32", (1 << 16,))]
    )
    it = st.stage(tmp_path, backend="host", coalesce_below=0)
    size = (tmp_path / "model.safetensors").stat().st_size
    os.truncate(tmp_path / "model.safetensors", size - 100)
    got = {}
    with pytest.raises(st.ReadError) as caught:
        for name, tensor in it:
            got[name] = tensor
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'model.safetensors'}: changed during the load"), message
    assert got == {}
    del got
    gc.collect()
    assert it.held() == ZERO


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def assert_rss_came_back(label: str, peaks: List[int], after: List[int], total: int) -> None:
    """Every load really held its `total` bytes (RSS with its tensors alive), and gave them back
    (RSS after each drop stays where it was after the first)."""
    mib = 1 << 20
    print(f"\n{label}: RSS with the tensors alive (MiB): {[p // mib for p in peaks]}")
    print(f"{label}: RSS after each drop (MiB): {[a // mib for a in after]}")
    assert min(peaks) - max(after) > total * 0.9
    assert max(after[1:]) - after[1] < 64 * mib


@pytest.mark.parametrize("backend", ["host"])
def test_ten_loads_of_1gib_do_not_grow_rss(big_checkpoint, backend: str) -> None:
    """Load and drop a 1 GiB checkpoint 10 times into memory of the library's own (`map=False`):
    RSS after each drop stays where it was after the first, and the library holds nothing."""
    directory, total = big_checkpoint
    after = []
    peaks = []
    for _ in range(10):
        with st.stage(directory, backend=backend, map=False) as it:
            tensors = dict(it)
        assert sum(t.nbytes for t in tensors.values()) == total
        peaks.append(rss_bytes())
        del tensors
        gc.collect()
        assert it.held() == ZERO
        after.append(rss_bytes())
    assert_rss_came_back(backend, peaks, after, total)


def mappings_of(path: Path) -> int:
    """How many mappings of `path` this process has (its lines in /proc/self/maps)."""
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if line.rstrip().endswith(str(path)))


def test_ten_mapped_loads_of_1gib_unmap_when_their_tensors_go(big_checkpoint) -> None:
    """Load a 1 GiB checkpoint as mappings 10 times, touching every page: the file is mapped
    once per load while its tensors live (RSS then counts its pages), unmapped when they are
    dropped, and RSS comes back each time."""
    directory, total = big_checkpoint
    files = sorted(Path(directory).glob("*.safetensors"))
    torch = pytest.importorskip("torch")
    after, peaks = [], []
    for _ in range(10):
        with st.stage(directory) as it:
            tensors = dict(it)
            report = it.report()
        assert report["paths"]["mapped"]["tensors"] == len(tensors)
        assert sum(t.nbytes for t in tensors.values()) == total
        for tensor in tensors.values():
            if tensor.nbytes:
                int(tensor.reshape(-1).view(torch.uint8)[::4096].sum())
        del tensor
        assert [mappings_of(f) for f in files] == [1] * len(files)
        peaks.append(rss_bytes())
        del tensors
        gc.collect()
        assert [mappings_of(f) for f in files] == [0] * len(files)
        assert it.held() == ZERO
        after.append(rss_bytes())
    assert_rss_came_back("mapped", peaks, after, total)


CHILD = textwrap.dedent(
    """
    import json, os, signal, sys, threading
    import safetensors_staging as st
    kept = []
    try:
        with st.stage(sys.argv[1], backend="host") as it:
            for name, tensor in it:
                kept.append(tensor)
                if len(kept) == 1:
                    # A real SIGINT, from another thread, while this one loads.
                    threading.Thread(target=os.kill, args=(os.getpid(), signal.SIGINT)).start()
        print("finished")
    except KeyboardInterrupt:
        n = len(kept)
        del kept, tensor
        print(json.dumps({"kept": n, "loaded": it.report()["tensors"], "held": it.held()}))
    """
)


def test_ctrl_c_stops_between_tensors_and_frees_everything(big_checkpoint) -> None:
    """Ctrl-C during a load: `KeyboardInterrupt` between tensors; leaving the `with` block ends
    the load (its read-ahead and staging buffers freed), and once the caller drops the tensors
    it kept, the library holds nothing."""
    directory, _ = big_checkpoint
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(directory)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout != "finished\n", "the load ran to its end"
    result = json.loads(out.stdout)
    # Stopped early: 48 tensors in all, the interrupt taken between two of them.
    assert 1 <= result["kept"] <= result["loaded"] < 48, result
    assert result["held"] == ZERO, result


def test_gil_is_released_while_bytes_move(tmp_path: Path) -> None:
    """With a switch interval of 100 s, the main thread, woken while the loading thread holds
    the GIL, runs again before that thread leaves `next` only if the library released the GIL
    while reading."""
    write_safetensors(tmp_path / "model.safetensors", [("w", "F32", (32 << 20,))])
    inside = threading.Event()
    started = threading.Event()

    def load() -> None:
        # Read into memory of our own (`map=False`): a mapping of a cached file moves no bytes.
        it = st.stage(tmp_path, map=False)
        started.set()  # wakes the main thread, which then waits for the GIL
        inside.set()
        next(it)  # 128 MiB read with the GIL released: the main thread runs now
        inside.clear()

    old = sys.getswitchinterval()
    sys.setswitchinterval(100)
    try:
        thread = threading.Thread(target=load)
        thread.start()
        started.wait()
        seen_inside = inside.is_set()
        thread.join()
    finally:
        sys.setswitchinterval(old)
    assert seen_inside


def test_progress_bar_on_a_terminal(minilm_dir: Path) -> None:
    code = f"import safetensors_staging as st; st.load_file({str(minilm_dir)!r}, progress=True)"
    controller, terminal = pty.openpty()
    child = subprocess.Popen(
        [sys.executable, "-c", code], stderr=terminal, stdout=subprocess.DEVNULL
    )
    os.close(terminal)
    output = b""
    while True:
        try:
            chunk = os.read(controller, 4096)
        except OSError:
            break
        if not chunk:
            break
        output += chunk
    assert child.wait(timeout=60) == 0
    text = output.decode(errors="replace")
    assert re.search(r"[0-9.]+ [kMG]?B/s", text), text
    assert "86.65 MiB" in text, text  # the bytes loaded, of the total (binary, as every size)
    # Not a terminal: nothing is drawn.
    quiet = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert quiet.stderr == ""


def test_exceptions_are_one_hierarchy() -> None:
    for cls in (
        st.MalformedCheckpointError,
        st.ReadError,
        st.BackendUnavailableError,
        st.OutOfMemoryError,
        st.SelectionError,
        st.DestinationError,
        st.UnsupportedDtypeError,
    ):
        assert issubclass(cls, st.StagingError) and cls.__module__ == "safetensors_staging"
    assert issubclass(st.StagingError, Exception)


def test_out_of_memory_without_fallback(minilm_dir: Path) -> None:
    """A cap of 0 leaves no room even for the staging buffer the host path needs."""
    with pytest.raises(st.OutOfMemoryError, match="staging buffer") as caught:
        st.load_file(minilm_dir, backend="host", memory_cap=0)
    assert isinstance(caught.value, MemoryError) and caught.value.kind == "device-allocation"


def test_dlpack_capsules_consumed_or_not_free_their_memory(tmp_path: Path) -> None:
    """A capsule nobody consumed, one consumed by torch, and exports of one tensor to both
    torch and NumPy: the memory goes back when the last of them goes."""
    import numpy as np

    write_safetensors(tmp_path / "model.safetensors", [("w", "F32", (1 << 16,))])
    it = _native._stage([str(tmp_path)], backend="host")
    name, staged = next(it)
    assert it.held()["caller"] == 4 << 16
    unused = staged.__dlpack__()
    as_torch = torch.from_dlpack(staged)
    as_numpy = np.from_dlpack(staged)
    assert as_numpy.ctypes.data == as_torch.data_ptr()  # zero-copy: one memory
    assert next(it, None) is None
    del unused, staged, as_torch
    gc.collect()
    assert it.held()["caller"] == 4 << 16  # NumPy still holds it
    del as_numpy
    gc.collect()
    assert it.held() == ZERO


STALLED_GET = STALLING_SERVER + textwrap.dedent(
    r"""
    import safetensors_staging as st

    it = st.stage(url, concurrency=1, threads=1, backend="host")
    first = next(it)
    stall.set()
    sent = []
    def interrupt():
        time.sleep(0.5)
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)
    threading.Thread(target=interrupt).start()
    try:
        for name, tensor in it:
            pass
        outcome = "finished"
    except KeyboardInterrupt:
        outcome = "KeyboardInterrupt"
    except st.StagingError as e:
        outcome = f"{type(e).__name__}: {e}"
    elapsed = time.monotonic() - sent[0] if sent else None
    it.close()
    del first
    done.set()
    print(json.dumps({"outcome": outcome, "after_signal_s": elapsed, "held": it.held()}))
    """
)


def test_ctrl_c_ends_a_load_stalled_on_a_get_within_a_second(tmp_path: Path) -> None:
    """A server that stops answering mid-load: Ctrl-C raises `KeyboardInterrupt` within about a
    second (the request timeout is 300 s), and the load holds nothing after."""
    write_safetensors(
        tmp_path / "model.safetensors",
        [("a", "F32", (64,)), ("b", "F32", (1 << 16,)), ("c", "F32", (8,))],
    )
    out = subprocess.run(
        [sys.executable, "-c", STALLED_GET, str(tmp_path / "model.safetensors")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["outcome"] == "KeyboardInterrupt", result
    assert result["after_signal_s"] < 1.5, result
    assert result["held"] == ZERO, result
