"""One options model for every door: the same settings given as `stage` flags, as Python keywords
and through C's `stg_config_set` produce equal options (the library's `LoadOptions`, printed by
`stage --print-options`, `stg_config_describe` and `_native._options`), defaults included; and
one error classification: for the same bad input, Python's exception class and `kind` and C's
status agree."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

import safetensors_staging as st
from safetensors_staging import _native

from conftest import CLibrary, write_safetensors

# Each row: settings as a Python caller gives them. Together the rows change every option.
TABLE: List[Dict[str, Any]] = [
    {},
    {"backend": "host", "device": "cpu"},
    {
        "backend": "cufile",
        "device": "cuda:1",
        "cufile_mode": "compat",
        "cufile_lib": "/opt/libcufile.so.0",
    },
    {
        "backend": "hipfile",
        "device": "hip:2",
        "hipfile_mode": "posix",
        "hipfile_lib": "/x/libhipfile.so",
        "hip_lib": "/x/libamdhip64.so",
    },
    {
        "device": 3,
        "memory_cap": 1 << 30,
        "chunk_size": 4 << 20,
        "staging_size": 8 << 20,
        "headroom_min": 1 << 29,
        "headroom_divisor": 8,
    },
    {
        "threads": 3,
        "staging_slots": 4,
        "coalesce_below": 0,
        "suballocate": False,
        "host_assembly": False,
        "direct_io": True,
        "map": False,
    },
    {
        "select": ["model.layers.0.*", "lm_head.weight"],
        "rows": {"*.q_proj.weight": "1/4", "embed": (0, 512)},
    },
    {
        "concurrency": 4,
        "range_size": 16 << 20,
        "retries": 2,
        "bandwidth": 500_000_000,
        "store_options": {"aws_region": "us-east-1", "allow_http": "true"},
        "allow_redirect": ["cdn.example.com", "*.hf.co"],
    },
    {
        "cache": False,
        "cache_dir": "/tmp/hf-cache",
    },
]


def spelled(settings: Dict[str, Any]) -> List[Tuple[str, str]]:
    """The settings as (key, text) pairs, as a C caller or a shell user spells them."""
    pairs: List[Tuple[str, str]] = []
    for key, value in settings.items():
        if key in ("select", "allow_redirect"):
            pairs += [(key, v) for v in value]
        elif key == "rows":
            pairs += [
                ("rows", f"{k}={v if isinstance(v, str) else f'{v[0]}:{v[1]}'}")
                for k, v in value.items()
            ]
        elif key == "store_options":
            pairs += [("store_option", f"{k}={v}") for k, v in value.items()]
        elif isinstance(value, bool):
            pairs.append((key, "true" if value else "false"))
        else:
            pairs.append((key, str(value)))
    return pairs


def cli(stage: Path, settings: Dict[str, Any]) -> str:
    args = [str(stage), "--print-options"]
    for key, value in spelled(settings):
        args += [f"--{key.replace('_', '-')}", value]
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout.rstrip("\n")


# A line of the library's `LoadOptions::describe()`: `key = value`, `key = value  # default`, or
# `# key = description (default)` where the default is a description rather than a value.
LINE = re.compile(r"^(?:(# )(\w+) = (.*) \(default\)|(\w+) = (.*?)(  # default)?)$")


def fields(description: str) -> Dict[str, str]:
    """Each key of a printed `LoadOptions` with its printed value (a repeatable key's values
    joined by newlines; a default as printed, marked `(default)`)."""
    assert description.endswith("\n"), description
    out: Dict[str, List[str]] = {}
    for line in description.splitlines():
        m = LINE.match(line)
        assert m, line
        if m.group(1):
            out.setdefault(m.group(2), []).append(f"{m.group(3)} (default)")
        else:
            out.setdefault(m.group(4), []).append(m.group(5) + (" (default)" if m.group(6) else ""))
    return {key: "\n".join(values) for key, values in out.items()}


def settings_of(description: str) -> List[Tuple[str, str]]:
    """The (key, value) pairs a description sets, defaults left out: what `stg_config_set`
    takes to give the same options again."""
    return [
        (key, value)
        for key, values in fields(description).items()
        for value in values.split("\n")
        if not value.endswith(" (default)")
    ]


@pytest.mark.parametrize("settings", TABLE, ids=lambda s: ",".join(s) or "defaults")
def test_every_door_gives_the_same_options(
    other_doors: Tuple[Path, Path], settings: Dict[str, Any]
) -> None:
    stage, ffi = other_doors
    python = st.describe_options(**settings)
    assert python == _native._options(**settings)
    # One line per key of the table, in its order (a repeatable key: one per value).
    keys = [row["name"] for row in _native._option_table()]
    assert list(fields(python)) == keys, python
    assert cli(stage, settings) + "\n" == python
    c = CLibrary(ffi)
    assert c.describe(spelled(settings)) == python
    # The lines set again give the same options.
    assert c.describe(settings_of(python)) == python


def test_the_description_marks_defaults_and_spells_values_as_set_takes_them() -> None:
    assert "describe_options" in st.__all__
    defaults = st.describe_options()
    lines = defaults.splitlines()
    assert lines[:4] == [
        "backend = auto  # default",
        "device = auto  # default",
        "# memory_cap = none (default)",
        "chunk_size = 16MiB  # default",
    ]
    assert "# select = every tensor (default)" in lines
    assert settings_of(defaults) == []
    given = st.describe_options(
        memory_cap=1 << 30,
        chunk_size="16MiB",
        select=["a.*", "b"],
        rows={"w": (0, 512)},
        store_options={"aws_region": "eu-west-1", "aws_secret_access_key": "SECRET"},
    ).splitlines()
    assert given[2:4] == ["memory_cap = 1GiB", "chunk_size = 16MiB  # default"]
    assert [line for line in given if line.startswith(("select", "rows", "store_option"))] == [
        "select = a.*",
        "select = b",
        "rows = w=0:512",
        "store_option = aws_region=eu-west-1",
        "store_option = aws_secret_access_key=<redacted>",
    ]
    assert len(given) == len(lines) + 2  # two values where one default line was
    with pytest.raises(st.InvalidOptionError, match=r'^option chunk_size="lots": '):
        st.describe_options(chunk_size="lots")
    with pytest.raises(TypeError, match="unexpected keyword argument 'chunk'"):
        st.describe_options(chunk=1)


def test_the_table_changes_every_option() -> None:
    defaults = fields(_native._options())
    changed = set()
    for settings in TABLE:
        for key, value in fields(_native._options(**settings)).items():
            if value != defaults[key]:
                changed.add(key)
    assert len(defaults) >= 24, defaults
    assert changed == set(defaults), set(defaults) - changed


def test_python_spellings_reach_the_same_parser() -> None:
    # torch.device, PathLike, ints and bools are spelled as text for the library's parser.
    torch = pytest.importorskip("torch")
    assert _native._options(device=torch.device("cuda", 2)) == _native._options(device="cuda:2")
    assert _native._options(cufile_lib=Path("/opt/x.so")) == _native._options(
        cufile_lib="/opt/x.so"
    )
    assert _native._options(memory_cap=1 << 20) == _native._options(memory_cap="1MiB")
    assert _native._options(direct_io=True) == _native._options(direct_io="yes")
    assert _native._options(map=False) == _native._options(map="false")
    assert _native._options(map=True) != _native._options(map="auto") == _native._options()
    # A bad value is the library's error: a ValueError naming key and value.
    with pytest.raises(st.InvalidOptionError, match=r'chunk_size="lots"') as raised:
        _native._options(chunk_size="lots")
    assert isinstance(raised.value, ValueError) and raised.value.kind == "invalid-option"
    with pytest.raises(TypeError, match="unexpected keyword argument 'chunk'"):
        _native._options(chunk=1)


# ---- one error classification -------------------------------------------------------------

# The C status of each kind (`stg_status` numbers) and the Python class.
KINDS = {
    "not-found": (203, "PathNotFoundError", FileNotFoundError),
    "invalid-checkpoint": (201, "MalformedCheckpointError", None),
    "not-a-checkpoint": (202, "MalformedCheckpointError", None),
    "selection": (800, "SelectionError", None),
    "invalid-option": (102, "InvalidOptionError", ValueError),
    "backend-unavailable": (600, "BackendUnavailableError", None),
}


def scenarios(tmp: Path) -> List[Tuple[str, str, Dict[str, Any], str]]:
    """(name, path, settings, expected kind) for bad input both doors can be given."""
    good = tmp / "good.safetensors"
    write_safetensors(good, [("w", "F32", (4, 4)), ("b", "F16", (4,))])
    bad_header = tmp / "bad.safetensors"
    bad_header.write_bytes((8).to_bytes(8, "little") + b"{nope!!}")
    short = tmp / "short.safetensors"
    short.write_bytes(good.read_bytes()[:-8])
    empty = tmp / "empty"
    empty.mkdir()
    return [
        ("missing file", str(tmp / "absent.safetensors"), {}, "not-found"),
        ("missing directory", str(tmp / "nowhere" / "model"), {}, "not-found"),
        ("bad header", str(bad_header), {}, "invalid-checkpoint"),
        ("file shorter than its header", str(short), {}, "invalid-checkpoint"),
        ("no checkpoint in a directory", str(empty), {}, "not-a-checkpoint"),
        ("unknown tensor", str(good), {"select": ["nope"]}, "selection"),
        ("rows past the end", str(good), {"rows": {"w": (2, 9)}}, "selection"),
        (
            "host backend on a GPU",
            str(good),
            {"backend": "host", "device": "cuda:0"},
            "invalid-option",
        ),
        ("zero threads", str(good), {"threads": 0}, "invalid-option"),
        ("cufile without a driver", str(good), {"backend": "cufile"}, "backend-unavailable"),
        ("a GPU asked for, none here", str(good), {"device": "cuda:0"}, "backend-unavailable"),
    ]


def test_python_and_c_classify_every_failure_alike(
    other_doors: Tuple[Path, Path], tmp_path: Path
) -> None:
    c = CLibrary(other_doors[1])
    seen = set()
    for name, path, settings, kind in scenarios(tmp_path):
        status, class_name, builtin = KINDS[kind]
        # Python's load_file defaults to device="cpu" (as safetensors' does); C's to "auto".
        settings = {"device": "auto", **settings}
        with pytest.raises(st.StagingError) as raised:
            st.load_file(path, **settings)
        error = raised.value
        assert error.kind == kind, (name, error.kind, error)
        assert type(error).__name__ == class_name, (name, type(error))
        assert isinstance(error, getattr(st, class_name)), name
        if builtin is not None:
            assert isinstance(error, builtin), (name, type(error).__mro__)
        c_status, message = c.load_status(spelled(settings), path)
        assert c_status == status, (name, c_status, message)
        assert message.replace("\n", " ") == str(error), name
        seen.add(kind)
    assert seen == set(KINDS)
