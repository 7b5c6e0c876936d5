"""How loaded tensors relate to their file, per framework and `map` value, beside `safetensors`:
what a truncation, an in-place rewrite, a rename over the file and a save back to it do to
tensors already loaded (`load_file`) and to a handle opened before (`safe_open`, then
`get_tensor`). Each row is a table row of the drop-in guide ("How tensors relate to the
file"), run in a child process (`file_events.py`): a mapped tensor of a truncated file kills
its process with SIGBUS, which is the outcome there, for `safetensors` as for us."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, Tuple

import pytest

pytest.importorskip("torch")
pytest.importorskip("safetensors")

EVENTS = ("truncate", "rewrite", "rename", "save-back")
SIGBUS = "SIGBUS"
KEPT = "unchanged"
MAPPED = {"truncate": SIGBUS, "rewrite": "changed", "rename": KEPT, "save-back": KEPT}
COPIED = {event: KEPT for event in EVENTS}

# (library, framework, map) -> what tensors loaded by `load_file` hold after each event.
LOADED: Dict[Tuple[str, str, str], Dict[str, str]] = {
    ("safetensors", "pt", "default"): MAPPED,
    ("safetensors", "np", "default"): COPIED,
    ("safetensors", "flax", "default"): COPIED,
    ("staging", "pt", "default"): MAPPED,
    ("staging", "pt", "true"): MAPPED,
    ("staging", "pt", "false"): COPIED,
    ("staging", "np", "default"): COPIED,
    ("staging", "np", "true"): MAPPED,
    ("staging", "np", "false"): COPIED,
    ("staging", "flax", "default"): COPIED,
    # JAX may alias a NumPy array's memory: a mapped array is copied into JAX's own.
    ("staging", "flax", "true"): COPIED,
    ("staging", "flax", "false"): COPIED,
}

# A handle opened before the event, then `get_tensor`: `safetensors` maps the file when it
# opens it and reads whatever the mapping holds then; a handle here serves the file it opened
# (a rename over it changes nothing) and refuses one changed in place (`ReadError`), reading
# no byte of it.
REFUSED = "error: ReadError"
OPENED: Dict[Tuple[str, str, str], Dict[str, str]] = {
    ("safetensors", "pt", "default"): {"truncate": SIGBUS, "rewrite": "changed", "rename": KEPT},
    ("safetensors", "np", "default"): {"truncate": SIGBUS, "rewrite": "changed", "rename": KEPT},
    ("staging", "pt", "default"): {"truncate": REFUSED, "rewrite": REFUSED, "rename": KEPT},
    ("staging", "pt", "false"): {"truncate": REFUSED, "rewrite": REFUSED, "rename": KEPT},
    ("staging", "np", "default"): {"truncate": REFUSED, "rewrite": REFUSED, "rename": KEPT},
    ("staging", "np", "true"): {"truncate": REFUSED, "rewrite": REFUSED, "rename": KEPT},
}

SCRIPT = Path(__file__).with_name("file_events.py")


def outcome(tmp_path: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args, str(tmp_path / "model.safetensors")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode == -signal.SIGBUS:
        return SIGBUS
    assert done.returncode == 0, done.stderr
    return " / ".join(done.stdout.split("\n")[:-1])


def needs(framework: str) -> None:
    if framework == "flax":
        pytest.importorskip("jax")


@pytest.mark.parametrize(("library", "framework", "mapping"), list(LOADED))
def test_loaded_tensors_after_each_event(
    tmp_path: Path, library: str, framework: str, mapping: str
) -> None:
    needs(framework)
    want = LOADED[(library, framework, mapping)]
    got = {}
    for event in EVENTS:
        got[event] = outcome(tmp_path, library, framework, mapping, "load_file", event)
    # A save back goes through a temporary file renamed into place (here; `safetensors` writes
    # in place, after reading the tensors): the file then holds the tensors' bytes.
    assert got.pop("save-back") == f"{want['save-back']} / file holds them"
    assert got == {event: want[event] for event in EVENTS if event != "save-back"}


@pytest.mark.parametrize(("library", "framework", "mapping"), list(OPENED))
def test_a_handle_after_each_event(
    tmp_path: Path, library: str, framework: str, mapping: str
) -> None:
    want = OPENED[(library, framework, mapping)]
    got = {
        event: outcome(tmp_path, library, framework, mapping, "safe_open", event) for event in want
    }
    assert got == want
