"""The drop-in's exceptions against `safetensors`' own: where the `safetensors` package imports,
every exception of this package is also a `safetensors.SafetensorError`, so that code which kept
`from safetensors import SafetensorError` still catches them; where it does not (not installed,
or the name mapped to this package by an import shim), the classes are as before and the package
imports and raises all the same. Also `details`, the longer story behind a message, on every
exception; and the ImportError naming the extra to install where torch or JAX is missing."""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import safetensors

import safetensors_staging as st
from safetensors_staging import _native

from conftest import write_safetensors

CLASSES = [name for name in _native.__all__ if name.endswith("Error")]


def run(code: str) -> str:
    """`code` in a fresh interpreter (this one's path); its stdout. Fails on a non-zero exit."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_every_class_is_a_safetensors_error_where_safetensors_imports() -> None:
    assert len(CLASSES) == 13, CLASSES
    for name in CLASSES:
        cls = getattr(st, name)
        assert issubclass(cls, safetensors.SafetensorError), name
        assert issubclass(cls, st.StagingError), name
    # Ours stays the base of ours: safetensors' own errors are not ours.
    assert st.SafetensorError is st.StagingError
    assert st.StagingError.__bases__ == (safetensors.SafetensorError,)
    assert not issubclass(safetensors.SafetensorError, st.StagingError)
    # The builtin bases stay where they were.
    assert st.PathNotFoundError.__mro__[1:5] == (
        st.ReadError,
        st.StagingError,
        safetensors.SafetensorError,
        FileNotFoundError,
    )


def test_except_safetensors_error_catches_a_load_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes((8).to_bytes(8, "little") + b"{nope!!}")
    from safetensors import SafetensorError  # as code written for safetensors has it

    with pytest.raises(SafetensorError) as raised:
        st.load_file(bad)
    assert type(raised.value) is st.MalformedCheckpointError
    assert raised.value.kind == "invalid-checkpoint"
    assert str(raised.value).startswith(str(bad)), raised.value
    # safe_open's, the drop-in's door, too.
    with pytest.raises(SafetensorError) as raised:
        st.safe_open(tmp_path / "absent.safetensors", framework="np")
    assert type(raised.value) is st.PathNotFoundError


def test_without_safetensors_nothing_changes(tmp_path: Path) -> None:
    absent = tmp_path / "absent.safetensors"
    out = run(
        f"""
        import sys
        sys.modules["safetensors"] = None  # `import safetensors` raises ImportError
        import safetensors_staging as st
        try:
            import safetensors
        except ImportError:
            print("no safetensors")
        print(st.StagingError.__bases__ == (Exception,), st.SafetensorError is st.StagingError)
        try:
            st.safe_open({str(absent)!r}, framework="np")
        except st.SafetensorError as e:
            print(type(e).__name__, e.kind, e.details, isinstance(e, FileNotFoundError))
        """
    )
    assert out.splitlines() == [
        "no safetensors",
        "True True",
        "PathNotFoundError not-found [] True",
    ]


def test_a_shim_mapping_safetensors_to_this_package_imports_once(tmp_path: Path) -> None:
    # As a harness running safetensors' own test suite against the drop-in does: the name
    # `safetensors` is this package, found while this package is being imported (the extension
    # looks `safetensors` up as it starts). No recursion, no import loop; the classes keep
    # Exception as their base.
    absent = tmp_path / "absent.safetensors"
    out = run(
        f"""
        import importlib, importlib.abc, importlib.util, sys

        class Shim(importlib.abc.MetaPathFinder, importlib.abc.Loader):
            calls = 0
            def find_spec(self, name, path, target=None):
                if name == "safetensors":
                    Shim.calls += 1
                    return importlib.util.spec_from_loader(name, self)
                return None
            def create_module(self, spec):
                return importlib.import_module("safetensors_staging")
            def exec_module(self, module):
                pass

        sys.meta_path.insert(0, Shim())
        import safetensors
        import safetensors_staging as st
        print(safetensors is st, Shim.calls, st.StagingError.__bases__ == (Exception,))
        try:
            st.safe_open({str(absent)!r}, framework="np")
        except safetensors.SafetensorError as e:
            print(type(e).__name__, e.kind)
        """
    )
    assert out.splitlines() == ["True 2 True", "PathNotFoundError not-found"]


def test_a_shim_set_after_import_changes_nothing() -> None:
    out = run(
        """
        import sys
        import safetensors_staging as st
        sys.modules["safetensors"] = st
        import safetensors
        print(safetensors.SafetensorError is st.StagingError, st.StagingError.__mro__[1].__name__)
        """
    )
    assert out.split() == ["True", "SafetensorError"]


def test_details_is_a_list_on_every_exception(tmp_path: Path) -> None:
    # Raised by the Python layer: an empty list of its own.
    raised = st.SelectionError("no tensor 'x'")
    assert raised.details == [] and raised.kind == "selection"
    raised.details.append("kept")
    assert st.SelectionError("again").details == []
    assert raised.details == ["kept"]
    # Made from a library error with none: empty too.
    with pytest.raises(st.PathNotFoundError) as caught:
        st.load_file(tmp_path / "absent.safetensors")
    assert caught.value.details == []
    # Pickled (a worker process's error sent back): kind and details come along.
    good = tmp_path / "good.safetensors"
    write_safetensors(good, [("w", "F32", (2, 2))])
    with pytest.raises(st.BackendUnavailableError) as caught:
        # No GPU backend can start with these libraries, GPU or not.
        st.load_file(
            good,
            device="cuda:0",
            cufile_lib="/nonexistent/libcufile.so",
            hipfile_lib="/nonexistent/libhipfile.so",
            hip_lib="/nonexistent/libamdhip64.so",
        )
    assert [d.split(":")[0] for d in caught.value.details] == ["cufile", "hipfile"]
    again = pickle.loads(pickle.dumps(caught.value))
    assert type(again) is st.BackendUnavailableError
    assert (str(again), again.kind, again.details) == (
        str(caught.value),
        "backend-unavailable",
        caught.value.details,
    )


@pytest.mark.parametrize(
    "code, needed_by, extra",
    [
        ("import safetensors_staging.torch", "safetensors_staging.torch", "torch"),
        (
            "st.load_file(path)",
            "safetensors_staging.stage (and load_file)",
            "torch",
        ),
        ("st.safe_open(path, framework='pt')", 'framework="pt"', "torch"),
        ("st.safe_open(path, framework='flax')", 'framework="flax"', "flax"),
        ("import safetensors_staging.flax as f; f.load_file(path)", 'framework="flax"', "flax"),
        (
            "import safetensors_staging.flax as f; f.load(open(path, 'rb').read())",
            'framework="flax"',
            "flax",
        ),
    ],
)
def test_a_missing_framework_names_the_extra(
    tmp_path: Path, code: str, needed_by: str, extra: str
) -> None:
    good = tmp_path / "good.safetensors"
    write_safetensors(good, [("w", "F32", (2, 2))])
    blocked = "torch" if extra == "torch" else "jax"
    out = run(
        f"""
        import sys
        sys.modules[{blocked!r}] = None  # as if not installed
        import safetensors_staging as st
        path = {str(good)!r}
        try:
            {code}
        except ModuleNotFoundError as e:
            print(e.name)
            print(e)
        # NumPy needs neither.
        import safetensors_staging.numpy as stn
        print(sorted(stn.load_file(path)))
        """
    )
    name, requirement = ("PyTorch", "torch") if extra == "torch" else ("JAX", "jax")
    assert out.splitlines() == [
        blocked,
        f"{needed_by} needs {name}, which is not installed: "
        f"pip install {requirement} (the [{extra}] extra of safetensors-staging)",
        "['w']",
    ]


def test_the_torch_extra_installs_torch() -> None:
    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert '\ntorch = ["torch>=2.1"]\n' in text
    assert '\nflax = ["jax"]\n' in text


def test_a_broken_framework_install_keeps_its_own_error() -> None:
    from safetensors_staging import _requires

    # torch's own dependency missing: not "torch is not installed"; the caller re-raises.
    assert _requires.missing(ModuleNotFoundError("no sympy", name="sympy"), "torch", "x") is None
    assert _requires.missing(ModuleNotFoundError("no", name="torch._C"), "torch", "x") is None
    with pytest.raises(
        ModuleNotFoundError,
        match=r"^x needs JAX, .* pip install jax \(the \[flax\] extra of safetensors-staging\)$",
    ) as raised:
        _requires.missing(ModuleNotFoundError("no jax", name="jax"), "jax.numpy", "x")
    assert raised.value.name == "jax" and raised.value.__cause__ is not None
