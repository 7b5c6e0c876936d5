"""The Python door under signals and threads (issue 33).

- A Ctrl-C interrupts only the call it arrived during: a SIGINT that Python turned into a
  `KeyboardInterrupt` somewhere else (Jupyter interrupting another cell) leaves a URL handle
  (`safe_open`, a `stage` iterator) working, and a SIGINT during a read the server stopped
  answering still ends that read.

Whatever could hang runs in a child process: the child gives up after a timeout of its own
(`os._exit`, so no stuck thread holds it) and says so, and the parent kills it after a longer
one; a regression fails instead of hanging the suite.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict

import pytest

from conftest import write_safetensors

ZERO = {"device": 0, "host": 0, "caller": 0}

# A child's prelude: a loopback HTTP server of one file (argv[1]) with ranged GETs, answered
# after `delay[0]` seconds, or never while `stall` is set (the connection stays open: only a
# timeout would end such a request); `url` is the file's.
SERVER = textwrap.dedent(
    r"""
    import json, os, signal, sys, threading, time
    from email.utils import formatdate
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    data = open(sys.argv[1], "rb").read()
    delay = [0.0]
    stall = threading.Event()
    done = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass
        def head(self, status, length, extra=()):
            self.send_response(status)
            self.send_header("Content-Length", str(length))
            self.send_header("Last-Modified", formatdate(1767225600, usegmt=True))
            for k, v in extra:
                self.send_header(k, v)
            self.end_headers()
        def do_HEAD(self):
            self.head(200, len(data))
        def do_GET(self):
            if stall.is_set():
                done.wait(600)
                return
            time.sleep(delay[0])
            a, b = self.headers["Range"].split("=")[1].split("-")
            a, b = int(a), int(b)
            self.head(206, b - a + 1, [("Content-Range", f"bytes {a}-{b}/{len(data)}")])
            self.wfile.write(data[a:b + 1])

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/model.safetensors"

    def finish(result):
        # `os._exit`: a thread stuck in the code under test must not keep the child alive.
        done.set()
        print(json.dumps(result), flush=True)
        os._exit(0)

    def give_up_after(seconds, scenario):
        # The scenario on a thread of its own; if it has not ended after `seconds`, it hung.
        result = {}
        thread = threading.Thread(target=scenario, args=(result,), daemon=True)
        thread.start()
        thread.join(seconds)
        if thread.is_alive():
            result["hung"] = True
        finish(result)
    """
)


def run_child(script: str, *args: str) -> dict:
    """Runs `script` in a child Python; its last line of output, as JSON."""
    try:
        out = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120)
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
    delay[0] = 0.3
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
