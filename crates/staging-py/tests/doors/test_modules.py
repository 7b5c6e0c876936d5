"""No module of the Python package imports one that imports it back, as the Rust crates' modules
(`tests/it/modules.rs` at the repository root): every import of a sibling counts, at the top of
a file, inside a function (a lazy import is still a use) or under `TYPE_CHECKING`. The package's
`__init__` re-exports the others and is imported by none of them."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set

import safetensors_staging

PACKAGE = Path(safetensors_staging.__file__).parent


def imports_of(source: str, siblings: Set[str]) -> Set[str]:
    """The sibling modules `source` imports (`__init__` for the package itself)."""
    used: Set[str] = set()
    for node in ast.walk(ast.parse(source)):
        # A sibling by a relative import, or by the package's name (`import torch` is torch).
        names: List[str] = []
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names = [node.module] if node.module else [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "safetensors_staging":
                names = [a.name for a in node.names]
            elif node.module.startswith("safetensors_staging."):
                names = [node.module.removeprefix("safetensors_staging.")]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "safetensors_staging":
                    used.add("__init__")
                elif alias.name.startswith("safetensors_staging."):
                    names.append(alias.name.removeprefix("safetensors_staging."))
        used.update(n.split(".")[0] for n in names if n.split(".")[0] in siblings)
    return used


def graph(package: Path) -> Dict[str, Set[str]]:
    files = {path.stem: path.read_text() for path in package.glob("*.py")}
    siblings = set(files)
    return {name: imports_of(text, siblings) - {name} for name, text in files.items()}


def cycles(edges: Dict[str, Set[str]]) -> List[str]:
    def reachable(start: str) -> Set[str]:
        seen: Set[str] = set()
        stack = list(edges[start])
        while stack:
            name = stack.pop()
            if name not in seen:
                seen.add(name)
                stack.extend(edges.get(name, ()))
        return seen

    return sorted(name for name in edges if name in reachable(name))


def test_no_module_of_the_package_imports_one_that_imports_it_back() -> None:
    edges = graph(PACKAGE)
    assert len(edges) >= 18, sorted(edges)
    assert cycles(edges) == [], edges
    assert [name for name, used in sorted(edges.items()) if "__init__" in used] == []
    # The engines' plugins and the front doors sit on the loading modules, never the other way.
    assert "_engines" in edges["vllm"] and "_load" in edges["_engines"]
    assert "_safe_open" in edges["transformers"]


def test_the_checker_sees_every_kind_of_import(tmp_path: Path) -> None:
    (tmp_path / "__init__.py").write_text("from .a import x\n")
    (tmp_path / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import y\n"
    )
    (tmp_path / "b.py").write_text("def f():\n    from . import c\n")
    (tmp_path / "c.py").write_text("import safetensors_staging.a\n")
    (tmp_path / "d.py").write_text("import safetensors_staging as st\nimport torch\n")
    (tmp_path / "torch.py").write_text("from safetensors_staging import d\n")
    edges = graph(tmp_path)
    assert edges == {
        "__init__": {"a"},
        "a": {"b"},
        "b": {"c"},
        "c": {"a"},
        "d": {"__init__"},
        "torch": {"d"},
    }
    assert cycles(edges) == ["a", "b", "c"]
