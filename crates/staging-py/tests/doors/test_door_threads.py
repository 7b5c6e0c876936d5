"""The Python door under signals and threads (issue 33, items 4, 6 and 8).

- A Ctrl-C interrupts only the call it arrived during: a SIGINT that Python turned into a
  `KeyboardInterrupt` somewhere else (Jupyter interrupting another cell) leaves a URL handle
  (`safe_open`, a `stage` iterator) working, and a SIGINT during a read the server stopped
  answering still ends that read.
- A destination callback may hand `close()` or `next()` of its own load to another thread and
  wait for it (an executor, `asyncio.run_coroutine_threadsafe`, a GUI thread): `close()` never
  waits for a running step (the step ends the load before the next tensor is read), and
  `next()` during a step raises `StagingError` at once. Closing a URL handle ends a read stalled
  on another thread.
- A bool destination takes only a BOOL tensor: other bytes would be invalid bools.

Whatever could hang runs in a child process: the child gives up after a timeout of its own
(`os._exit`, so no stuck thread holds it) and says so, and the parent kills it after a longer
one; a regression fails instead of hanging the suite.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict

import pytest
import torch

import safetensors_staging as st

from conftest import STALLING_SERVER, write_safetensors

ZERO = {"device": 0, "host": 0, "caller": 0}

# The child's prelude: conftest's stalling server of one file.
SERVER = STALLING_SERVER


def run_child(script: str, *args: str) -> dict:
    """Runs `script` in a child Python; its last line of output, as JSON."""
    try:
        out = subprocess.run(
            [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the child hung (killed after 120 s)")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


SPECS = [("a", "F32", (64,)), ("b", "F32", (1024,)), ("c", "U8", (100,))]


def checkpoint(tmp_path: Path) -> Dict[str, str]:
    """The checkpoint of `SPECS` at `tmp_path/model.safetensors`; its tensors' bytes in hex."""
    contents = write_safetensors(tmp_path / "model.safetensors", SPECS)
    return {name: data.hex() for name, data in contents.items()}


# --- Item 4: a Ctrl-C interrupts only the call it arrived during -----------------------------

CTRL_C = SERVER + textwrap.dedent(
    r"""
    import safetensors_staging as st

    def ctrl_c_elsewhere():
        # Jupyter interrupting another cell: a real SIGINT, with Python's own handler (the one the
        # library chains after), turned into a KeyboardInterrupt in code that catches it, while
        # no call of the handle runs.
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
        deadline = time.monotonic() + 20
        try:
            while time.monotonic() < deadline:
                time.sleep(0.01)
            return "not interrupted"
        except KeyboardInterrupt:
            return "KeyboardInterrupt"

    def attempt(read):
        try:
            return {"hex": read()}
        except BaseException as e:  # KeyboardInterrupt included
            return {"raised": [type(e).__name__, str(e)]}

    def ctrl_c_during(read):
        # A SIGINT 0.5 s into `read`; how long after it `read` ended.
        sent = []
        def interrupt():
            time.sleep(0.5)
            sent.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGINT)
        threading.Thread(target=interrupt).start()
        outcome = attempt(read)
        outcome["after_signal_s"] = time.monotonic() - sent[0] if sent else None
        return outcome

    # Every GET takes 0.3 s: an interrupt predicate that fires is asked (every 50 ms) before the
    # answer comes, as on a real network.
    server.delay = 0.3
    result = {}
    if sys.argv[2] == "safe_open":
        with st.safe_open(url, "np", concurrency=1, threads=1) as f:
            result["elsewhere"] = ctrl_c_elsewhere()
            result["after"] = attempt(lambda: f.get_tensor("b").tobytes().hex())
            stall.set()
            result["stalled"] = ctrl_c_during(lambda: f.get_tensor("c").tobytes().hex())
            stall.clear()
            result["again"] = attempt(lambda: f.get_tensor("a").tobytes().hex())
            result["tensors"] = f.report()["tensors"]
    else:
        it = st.stage(url, backend="host", concurrency=1, threads=1)
        name, tensor = next(it)
        result["first"] = [name, tensor.numpy().tobytes().hex()]
        del tensor
        result["elsewhere"] = ctrl_c_elsewhere()
        result["after"] = attempt(lambda: [(n, t.numpy().tobytes().hex()) for n, t in [next(it)]])
        stall.set()
        result["stalled"] = ctrl_c_during(lambda: [n for n, t in [next(it)]])
        it.close()
        result["held"] = it.held()
    finish(result)
    """
)


def test_a_ctrl_c_elsewhere_leaves_a_url_handle_working(tmp_path: Path) -> None:
    """`safe_open` of a URL: a Ctrl-C caught by other code while no read of the handle ran does
    not fail the handle's later reads (they return their bytes); a Ctrl-C during a read the
    server stopped answering ends that read with `KeyboardInterrupt` within about a second (the
    request timeout is 300 s); and the handle reads again after that."""
    expected = checkpoint(tmp_path)
    result = run_child(CTRL_C, str(tmp_path / "model.safetensors"), "safe_open")
    assert result["elsewhere"] == "KeyboardInterrupt", result
    assert result["after"] == {"hex": expected["b"]}, result
    stalled = result["stalled"]
    assert stalled["raised"][0] == "KeyboardInterrupt", result
    assert stalled["after_signal_s"] < 1.5, result
    assert result["again"] == {"hex": expected["a"]}, result
    assert result["tensors"] == 2, result


def test_a_ctrl_c_between_steps_leaves_a_url_load_working(tmp_path: Path) -> None:
    """The same for a `stage` iterator of a URL: a Ctrl-C caught elsewhere between two `next()`
    calls does not fail the next one; a Ctrl-C during a stalled `next()` still ends it, and the
    load holds nothing after."""
    expected = checkpoint(tmp_path)
    result = run_child(CTRL_C, str(tmp_path / "model.safetensors"), "stage")
    assert result["first"] == ["a", expected["a"]], result
    assert result["elsewhere"] == "KeyboardInterrupt", result
    assert result["after"] == {"hex": [["b", expected["b"]]]}, result
    stalled = result["stalled"]
    assert stalled["raised"][0] == "KeyboardInterrupt", result
    assert stalled["after_signal_s"] < 1.5, result
    assert result["held"] == ZERO, result


# --- Item 6: close() and next() handed to another thread by the destination callback ---------

HAND_OFF = SERVER + textwrap.dedent(
    r"""
    import asyncio, concurrent.futures, gc
    import safetensors_staging as st

    path, method, via = sys.argv[1], sys.argv[2], sys.argv[3]
    pool = concurrent.futures.ThreadPoolExecutor(1)
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    def on_another_thread(call):
        # `call` run by another thread, waited for without a timeout, as real code waits.
        if via == "executor":
            return pool.submit(call).result()
        async def coroutine():
            return call()
        return asyncio.run_coroutine_threadsafe(coroutine(), loop).result()

    def scenario(result):
        seen = []
        it = None

        def destination(name, info):
            entry = {"name": name}
            if name == "b":
                try:
                    if method == "close":
                        on_another_thread(it.close)
                        entry["value"] = "closed"
                    else:
                        on_another_thread(lambda: next(it))
                        entry["value"] = "returned"
                except Exception as e:
                    entry["raised"] = [type(e).__name__, isinstance(e, st.StagingError), str(e)]
            seen.append(entry)
            return None

        it = st.stage(path, backend="host", destination=destination, coalesce_below=0, threads=1, map=False)
        got = {}
        try:
            for name, tensor in it:
                got[name] = tensor
            result["error"] = None
        except Exception as e:
            result["error"] = [type(e).__name__, str(e)]
        result["seen"] = seen
        result["got"] = {name: t.numpy().tobytes().hex() for name, t in got.items()}
        result["tensors"] = it.report()["tensors"]
        result["held_while_kept"] = it.held()
        del got, tensor
        gc.collect()
        result["held"] = it.held()

    give_up_after(30, scenario)
    """
)


@pytest.mark.parametrize("via", ["executor", "asyncio"])
def test_close_handed_to_another_thread_by_the_callback_ends_the_load(
    tmp_path: Path, via: str
) -> None:
    """The callback asked for "b" hands `close()` to another thread and waits for it: `close()`
    returns at once, the load ends before "b" is read, the iteration ends quietly, and once
    "a" (handed out before) is dropped nothing is held."""
    expected = checkpoint(tmp_path)
    result = run_child(HAND_OFF, str(tmp_path / "model.safetensors"), "close", via)
    assert not result.get("hung"), f"close() on another thread deadlocked with the callback ({via})"
    assert result["error"] is None, result
    assert [e["name"] for e in result["seen"]] == ["a", "b"], result
    assert result["seen"][1] == {"name": "b", "value": "closed"}, result
    assert result["got"] == {"a": expected["a"]}, result
    assert result["tensors"] == 1, result
    # The load's buffers are freed; "a" is the caller's until dropped.
    assert result["held_while_kept"] == {"device": 0, "host": 0, "caller": 64 * 4}, result
    assert result["held"] == ZERO, result


@pytest.mark.parametrize("via", ["executor", "asyncio"])
def test_next_handed_to_another_thread_by_the_callback_raises_at_once(
    tmp_path: Path, via: str
) -> None:
    """The callback hands `next()` of its own load to another thread and waits: that `next()`
    raises `StagingError` at once, saying why, and the load goes on unharmed."""
    expected = checkpoint(tmp_path)
    result = run_child(HAND_OFF, str(tmp_path / "model.safetensors"), "next", via)
    assert not result.get("hung"), f"next() on another thread deadlocked with the callback ({via})"
    raised = result["seen"][1].get("raised")
    assert raised is not None, result
    name, is_staging_error, message = raised
    assert name == "StagingError" and is_staging_error, raised
    assert "next()" in message and "while" in message and "another thread" in message, message
    assert result["error"] is None, result
    assert result["got"] == expected, result
    assert result["tensors"] == 3, result
    assert result["held"] == ZERO, result


CLOSE_DURING_STEP = SERVER + textwrap.dedent(
    r"""
    import gc
    import safetensors_staging as st

    def scenario(result):
        # A step running on a worker thread, its callback waiting for this thread; this thread
        # closes the load, then lets the callback go on.
        in_callback, released = threading.Event(), threading.Event()

        def destination(name, info):
            if name == "b":
                in_callback.set()
                released.wait(30)
            return None

        it = st.stage(sys.argv[1], backend="host", destination=destination, coalesce_below=0, threads=1)
        got = {}
        def iterate():
            try:
                for name, tensor in it:
                    got[name] = tensor.numpy().tobytes().hex()
                result["error"] = None
            except Exception as e:
                result["error"] = [type(e).__name__, str(e)]
        worker = threading.Thread(target=iterate)
        worker.start()
        in_callback.wait(30)
        started = time.monotonic()
        it.close()
        result["close_s"] = time.monotonic() - started
        released.set()
        worker.join(30)
        result["got"] = got
        result["tensors"] = it.report()["tensors"]
        gc.collect()
        result["held"] = it.held()

    give_up_after(30, scenario)
    """
)


def test_close_from_another_thread_does_not_wait_for_a_running_step(tmp_path: Path) -> None:
    """`close()` from the main thread while a worker's step waits in its callback: it returns at
    once; the step then ends the load before "b" is read, and nothing is held."""
    expected = checkpoint(tmp_path)
    result = run_child(CLOSE_DURING_STEP, str(tmp_path / "model.safetensors"))
    assert not result.get("hung"), "close() waited for the step it should only have stopped"
    assert result["close_s"] < 1.0, result
    assert result["error"] is None, result
    assert result["got"] == {"a": expected["a"]}, result
    assert result["tensors"] == 1, result
    assert result["held"] == ZERO, result


CLOSE_STALLED_READ = SERVER + textwrap.dedent(
    r"""
    import safetensors_staging as st

    def scenario(result):
        f = st.safe_open(url, "np", concurrency=1, threads=1)
        stall.set()
        def read():
            try:
                f._reader.read("b")
                result["read"] = "returned"
            except Exception as e:
                result["read"] = [type(e).__name__, str(e)]
            result["read_s"] = time.monotonic() - started
        started = time.monotonic()
        reader = threading.Thread(target=read)
        reader.start()
        time.sleep(0.5)
        f.close()
        result["close_s"] = time.monotonic() - started
        reader.join(10)
        result["read_ended"] = not reader.is_alive()
        result["closed"] = f._reader.closed

    give_up_after(30, scenario)
    """
)


def test_closing_a_url_handle_ends_a_read_stalled_on_another_thread(tmp_path: Path) -> None:
    """`safe_open` of a URL whose server stopped answering: a read on another thread waits on
    it; `close()` returns at once and that read ends within about a second (not at the request
    timeout), with the error a read of a closed handle raises."""
    checkpoint(tmp_path)
    result = run_child(CLOSE_STALLED_READ, str(tmp_path / "model.safetensors"))
    assert not result.get("hung"), result
    assert result["close_s"] < 1.5, result
    assert result["read_ended"], f"the read went on after close(): {result}"
    assert result["read"] == ["StagingError", "File is closed"], result
    assert result["read_s"] < 2.0, result
    assert result["closed"] is True


# --- Items 4 and 6 for `safe_open`'s read ahead ----------------------------------------------

# `get_tensor("a")` of a URL handle reads "b" ahead on a thread of the handle; the first GET of
# "b"'s bytes is never answered (`b_asked` is set when it arrives), later ones are. Two GETs in
# flight (`concurrency=2`): with one, the read of "a" could wait behind the stalled GET of "b".
READ_AHEAD = SERVER + textwrap.dedent(
    r"""
    import safetensors_staging as st

    size = int.from_bytes(data[:8], "little")
    b_start = 8 + size + json.loads(data[8:8 + size])["b"]["data_offsets"][0]
    b_asked = threading.Event()
    b_gets = []

    def hold(request):
        if request.range is None or request.range[0] != b_start:
            return False
        b_gets.append(time.monotonic())
        if len(b_gets) == 1:
            b_asked.set()
            return True
        return False

    server.hold = hold

    def close_during_read_ahead(result):
        f = st.safe_open(url, "np", concurrency=2, threads=1)
        result["a"] = f.get_tensor("a").tobytes().hex()
        result["b_asked"] = b_asked.wait(10)
        started = time.monotonic()
        f.close()
        result["close_s"] = time.monotonic() - started

    def ctrl_c_during_read_ahead():
        # On the main thread, where Python raises KeyboardInterrupt; a watchdog ends the child
        # if a read waits on the server instead.
        result = {}
        threading.Timer(30, lambda: finish(dict(result, hung=True))).start()
        f = st.safe_open(url, "np", concurrency=2, threads=1)
        result["a"] = f.get_tensor("a").tobytes().hex()
        result["b_asked"] = b_asked.wait(10)
        # Only the read ahead of "b" runs: a Ctrl-C now, with Python's own handler, caught by
        # other code (as Jupyter's interrupted cell catches it).
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
        try:
            time.sleep(20)
            result["elsewhere"] = "not interrupted"
        except KeyboardInterrupt:
            result["elsewhere"] = "KeyboardInterrupt"
        try:
            result["b"] = {"hex": f.get_tensor("b").tobytes().hex()}
        except BaseException as e:  # KeyboardInterrupt included
            result["b"] = {"raised": [type(e).__name__, str(e)]}
        result["b_gets"] = len(b_gets)
        f.close()
        finish(result)

    if sys.argv[2] == "close":
        give_up_after(15, close_during_read_ahead)
    else:
        ctrl_c_during_read_ahead()
    """
)


def test_closing_a_url_handle_ends_its_stalled_read_ahead(tmp_path: Path) -> None:
    """`safe_open` of a URL: `get_tensor("a")` reads "b" ahead, and the server never answers
    that read; `close()` then returns within about a second (it interrupts the read ahead
    before waiting for it), not at the request timeout (300 s)."""
    expected = checkpoint(tmp_path)
    result = run_child(READ_AHEAD, str(tmp_path / "model.safetensors"), "close")
    assert not result.get("hung"), f"close() waited for the stalled read ahead: {result}"
    assert result["a"] == expected["a"], result
    assert result["b_asked"], f'"b" was not read ahead: {result}'
    assert result["close_s"] < 1.5, result


def test_a_read_ahead_ended_by_a_ctrl_c_elsewhere_is_read_again(tmp_path: Path) -> None:
    """A Ctrl-C caught by other code while only the read ahead of "b" ran (its GET not answered)
    ends that read ahead; `get_tensor("b")` then reads "b" itself and returns its bytes, rather
    than raising the read ahead's error."""
    expected = checkpoint(tmp_path)
    result = run_child(READ_AHEAD, str(tmp_path / "model.safetensors"), "ctrl_c")
    assert not result.get("hung"), f"a read waited on the stalled GET: {result}"
    assert result["a"] == expected["a"], result
    assert result["b_asked"], f'"b" was not read ahead: {result}'
    assert result["elsewhere"] == "KeyboardInterrupt", result
    assert result["b"] == {"hex": expected["b"]}, result
    # The read ahead's GET (never answered) and get_tensor's own.
    assert result["b_gets"] == 2, result


# --- Item 8: a bool destination takes only a BOOL tensor ----------------------------------------


def test_a_bool_destination_is_refused_for_a_tensor_that_is_not_bool(tmp_path: Path) -> None:
    """A bool destination for an F32 tensor: `DestinationError` naming the tensor and both
    dtypes, before anything is read into it; a BOOL tensor goes into a bool destination; the
    load holds nothing after."""
    path = tmp_path / "model.safetensors"
    contents = write_safetensors(
        path, [("mask", "BOOL", (64,)), ("w", "F32", (16,)), ("z", "U8", (8,))]
    )
    given = {}

    def destination(name: str, info: st.TensorInfo):
        given[name] = torch.zeros(info.nbytes, dtype=torch.bool)
        return given[name]

    it = st.stage(path, backend="host", destination=destination, coalesce_below=0, threads=1)
    got = {}
    with pytest.raises(st.DestinationError) as caught:
        for name, tensor in it:
            got[name] = tensor
    message = str(caught.value)
    assert message.startswith('tensor "w": '), message
    assert "bool" in message and "F32" in message, message
    assert caught.value.kind == "destination"
    assert list(got) == ["mask"]
    assert got["mask"] is given["mask"]
    assert got["mask"].numpy().tobytes() == contents["mask"]
    assert not given["w"].any(), "nothing was written into the bool destination of an F32 tensor"
    del got, tensor
    gc.collect()
    assert it.held() == ZERO


def test_other_byte_sized_destinations_stay_accepted(tmp_path: Path) -> None:
    """What callers give today still works: uint8 buffers for any tensor, the tensor's own dtype
    (bool for BOOL), and a BOOL tensor's bytes into uint8 or int8."""
    path = tmp_path / "model.safetensors"
    specs = [
        ("m1", "BOOL", (32,)),
        ("m2", "BOOL", (16,)),
        ("m3", "BOOL", (8,)),
        ("w", "F32", (16,)),
        ("h", "F16", (4, 4)),
    ]
    contents = write_safetensors(path, specs)
    dtypes = {
        "m1": torch.bool,
        "m2": torch.uint8,
        "m3": torch.int8,
        "w": torch.uint8,
        "h": torch.float16,
    }

    def destination(name: str, info: st.TensorInfo):
        return torch.empty(
            info.nbytes // torch.empty((), dtype=dtypes[name]).element_size(), dtype=dtypes[name]
        )

    with st.stage(path, backend="host", destination=destination, coalesce_below=0, threads=1) as it:
        got = dict(it)
    assert {name: t.dtype for name, t in got.items()} == dtypes
    assert {name: t.view(torch.uint8).numpy().tobytes() for name, t in got.items()} == contents
    del got
    gc.collect()
    assert it.held() == ZERO
