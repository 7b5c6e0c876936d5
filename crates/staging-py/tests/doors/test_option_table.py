"""The Python door against the library's tables: the stubs' `LoadOptions` TypedDict has one key
per keyword of the table of load options (`_native._option_table()`), every alias of the table
is a keyword, and every exception class `docs/reference/errors.md` maps an error kind to is a
`StagingError` raised for that kind."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, List

import pytest

import safetensors_staging as st
from safetensors_staging import _native

HERE = Path(__file__).resolve().parent
STUB = HERE.parents[1] / "python" / "safetensors_staging" / "_native.pyi"
ERRORS_PAGE = HERE.parents[3] / "docs" / "reference" / "errors.md"


def stub_class_keys(name: str) -> List[str]:
    """The annotated names of class `name` in the stub."""
    tree = ast.parse(STUB.read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return [
                item.target.id
                for item in node.body
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
            ]
    raise AssertionError(f"{STUB} has no class {name}")


def stub_functions() -> List[str]:
    return [
        node.name for node in ast.parse(STUB.read_text()).body if isinstance(node, ast.FunctionDef)
    ]


def test_the_stub_s_load_options_are_the_table_s_keywords() -> None:
    table = _native._option_table()
    keywords = [row["keyword"] for row in table]
    assert stub_class_keys("LoadOptions") == keywords
    assert "_option_table" in stub_functions()
    for row in table:
        assert set(row) == {
            "name",
            "keyword",
            "aliases",
            "kind",
            "value_name",
            "choices",
            "default",
            "default_is_value",
            "help",
        }
        assert row["help"] and row["default"]


def test_every_keyword_and_alias_is_accepted() -> None:
    defaults = _native._options()
    for row in _native._option_table():
        for keyword in [row["keyword"], *row["aliases"]]:
            # Every keyword is known (an unknown one is a TypeError); None keeps the default.
            assert _native._options(**{keyword: None}) == defaults, keyword


def test_an_alias_sets_its_key() -> None:
    aliased = [row for row in _native._option_table() if row["aliases"]]
    assert aliased, "the table has no alias to test"
    assert _native._options(device_memory="1GiB") == _native._options(memory_cap="1GiB")
    with pytest.raises(st.InvalidOptionError, match="option device_memory="):
        _native._options(device_memory="lots")


def test_unknown_keywords_are_type_errors() -> None:
    # `store_option` is C's and `stage`'s key; Python's keyword is `store_options`, a mapping.
    for keyword in ["store_option", "chunk", "memory"]:
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{keyword}'"):
            _native._options(**{keyword: "x"})


def error_rows() -> Dict[str, str]:
    """kind -> Python class, from the generated error reference."""
    rows = {}
    for line in ERRORS_PAGE.read_text().splitlines():
        match = re.match(r"\| `([a-z-]+)` \|.*\| `(\w+)` \| `(\w+)` \|$", line)
        if match:
            rows[match.group(1)] = match.group(2)
    return rows


def test_the_error_reference_names_the_classes_raised() -> None:
    rows = error_rows()
    # The page parsed (the generated page has a row per kind: reference.rs holds it to the table).
    assert len(rows) >= 17, rows
    for name in rows.values():
        cls = getattr(st, name)
        assert issubclass(cls, st.StagingError), name
    # The class raised for each kind is the one the page names (both come from the library's
    # one table, KINDS_IN_DOORS).
    from safetensors_staging import _native

    for kind, name in rows.items():
        assert _native._error_class(kind) is getattr(st, name), kind
    # A class's own `kind` is one of the kinds the page maps to it.
    for name in set(rows.values()):
        cls = getattr(st, name)
        assert rows.get(cls.kind) == name, (name, cls.kind)
