#!/usr/bin/env python3
"""Runs every code block of the documentation, so that no example drifts from the code.

    python .ci/docs_blocks.py --stage target/debug/stage [FILE.md ...]

Collects the fenced blocks of `docs/**/*.md` and `README.md` (or of the files given) and runs:

- ```python blocks: the blocks of one page in order, in one namespace (like a doctest session),
  with a fresh temporary directory as the working directory;
- ```bash and ```sh blocks: the whole block, with `bash -euo pipefail`, in the same directory;
- ```console blocks: each line starting with `$ ` (a line ending in `\\` continues on the next),
  the other lines being output, which is shown, not compared.

`stage` is on PATH: the binary given by `--stage`. The Python that runs this script runs the
Python blocks, so it must have the package (`maturin develop`) and its test extras.

```text, ```json, ```toml (and any other language) are not run. ```rust blocks are doctests:
`src/lib.rs` includes every page that has them (`cargo test -p safetensors-staging --doc`).
```c and ```cpp blocks are compiled with `--cc`/`--cxx` (syntax only, against the header in
`crates/staging-ffi/include`) when those compilers exist, else reported as skipped.

An HTML comment on the line before a block marks it:

- `<!-- docs: skip REASON -->`: not run; the summary lists it with its reason. For blocks that
  need a GPU, a cloud or a real engine, and only those.
- `<!-- docs: setup -->`: run like any block; if it fails, the rest of its page is not run
  (each reported as failed, naming the setup block) instead of failing again for the same reason.
- `<!-- docs: repo -->`: a shell or console block that runs in the repository root (build
  commands written for a checkout, such as `cargo build ...`), not in the page's directory; what
  it writes goes under `target/`.

Prints a summary (run, skipped with reasons, failed) and exits 1 on any failure.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import traceback
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
MARK = re.compile(r"^\s*<!--\s*docs:\s*(?P<what>skip|setup|repo)\b\s*(?P<reason>.*?)\s*-->\s*$")
RUN_AS = {
    "python": "python",
    "py": "python",
    "bash": "shell",
    "sh": "shell",
    "shell": "shell",
    "console": "console",
}
COMPILE_AS = {"c": "c", "cpp": "cpp", "c++": "cpp"}
NOT_RUN = {
    "text",
    "json",
    "toml",
    "yaml",
    "ini",
    "",
    "rust",
    "diff",
    "cmake",
    "mermaid",
}
TIMEOUT_S = 600


@dataclass
class Block:
    """One fenced block: where it is, its language, its code, and its mark."""

    path: Path
    line: int
    lang: str
    code: str
    mark: str | None = None
    reason: str = ""

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path}:{self.line}"


@dataclass
class Summary:
    run: list[Block] = field(default_factory=list)
    skipped: list[Block] = field(default_factory=list)
    failed: list[tuple] = field(default_factory=list)
    not_run: dict[str, int] = field(default_factory=dict)


def blocks_of(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, with the mark of the comment just before each."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence = len(m["indent"]), m["fence"]
        lang = (m["info"].split() or [""])[0].lower().split(",")[0]
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not (
            lines[i].strip().startswith(fence)
            and lines[i].strip() == fence[0] * len(lines[i].strip())
        ):
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        i += 1
        prev = start - 1
        while prev >= 0 and not lines[prev].strip():
            prev -= 1
        mark = MARK.match(lines[prev]) if prev >= 0 else None
        blocks.append(
            Block(
                path,
                start + 1,
                lang,
                "\n".join(body) + "\n",
                mark["what"] if mark else None,
                mark["reason"] if mark else "",
            )
        )
    return blocks


def console_commands(code: str) -> list[str]:
    """The commands of a console block: lines after `$ `, joined over trailing backslashes."""
    commands: list[str] = []
    lines = code.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("$ "):
            command = line[2:]
            while command.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                command = command.rstrip()[:-1] + " " + lines[i].strip()
            commands.append(command)
        i += 1
    return commands


VERBOSE = False


def show(block: Block, output: str) -> None:
    """With --verbose, what a block printed."""
    if VERBOSE and output.strip():
        print(f"--- {block.where()} ({block.lang})\n{output.rstrip()}")


def run_shell(script: str, cwd: Path, env: dict[str, str], block: Block) -> str | None:
    """Runs a shell script in a session of its own (a timeout ends all of it, `cargo` and its
    `rustc`s too); None on success, else what it printed and its status."""
    with subprocess.Popen(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    ) as process:
        try:
            output, _ = process.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            return f"timed out after {TIMEOUT_S} s (--timeout)"
    if process.returncode != 0:
        return f"exit status {process.returncode}\n{output[-4000:]}"
    show(block, output)
    return None


def run_python(code: str, namespace: dict[str, object], block: Block) -> str | None:
    """Runs Python code in the page's namespace; None on success, else the traceback."""
    out = io.StringIO()
    try:
        compiled = compile(code, block.where(), "exec")
        with contextlib.redirect_stdout(out):
            exec(compiled, namespace)  # noqa: S102 (the documentation's own examples)
    except BaseException:  # noqa: BLE001 (every failure of an example is reported, SystemExit too)
        return out.getvalue()[-2000:] + traceback.format_exc(limit=8)
    show(block, out.getvalue())
    return None


def compile_c(block: Block, compiler: str | None, cwd: Path) -> str | None:
    """Compiles a C or C++ block for syntax against the header (in a function body if it has
    no function of its own); None on success."""
    include = ROOT / "crates/staging-ffi/include"
    cpp = COMPILE_AS[block.lang] == "cpp"
    code = block.code
    if not re.search(r"^\s*(int|void|static)\s+\w+\s*\(", code, re.MULTILINE):
        code = "void docs_block(void) {\n" + code + "\n}\n"
    head = (
        '#include "staging_ffi.h"\n#include <stddef.h>\n#include <stdint.h>\n#include <stdio.h>\n'
    )
    if cpp:
        head += '#include "staging.hpp"\n#include <cstdio>\n#include <string>\n'
    source = cwd / ("block.cpp" if cpp else "block.c")
    source.write_text(head + code, encoding="utf-8")
    args = [
        compiler,
        "-fsyntax-only",
        "-Wall",
        "-Werror",
        "-Wno-unused-variable",
        f"-I{include}",
    ]
    args += ["-std=c++17"] if cpp else ["-std=c11"]
    done = subprocess.run(
        [*args, str(source)],
        check=False,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return None if done.returncode == 0 else done.stdout[-4000:]


def run_page(
    path: Path,
    env: dict[str, str],
    compilers: dict[str, str | None],
    summary: Summary,
    only: set[str] | None = None,
) -> None:
    """Runs one page's blocks in order, in one temporary directory and one Python namespace
    (with `only`, the blocks run as those kinds, "python", "shell", "console", "c", "cpp")."""
    blocks = blocks_of(path)
    if only is not None:
        kept = []
        for block in blocks:
            kind = RUN_AS.get(block.lang) or COMPILE_AS.get(block.lang)
            if kind in only:
                kept.append(block)
            else:
                what = f"{block.lang or '(none)'} (not asked for)"
                summary.not_run[what] = summary.not_run.get(what, 0) + 1
        blocks = kept
    if not blocks:
        return
    namespace: dict[str, object] = {"__name__": "__docs__"}
    setup_failed: str | None = None
    here = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="docs-blocks-") as tmp:
        cwd = Path(tmp)
        os.chdir(cwd)
        try:
            for block in blocks:
                kind = RUN_AS.get(block.lang)
                compile_kind = COMPILE_AS.get(block.lang)
                if block.mark == "skip":
                    summary.skipped.append(block)
                    continue
                if kind is None and compile_kind is None:
                    summary.not_run[block.lang or "(none)"] = (
                        summary.not_run.get(block.lang or "(none)", 0) + 1
                    )
                    continue
                if compile_kind is not None and compilers.get(compile_kind) is None:
                    block.reason = f"no {compile_kind} compiler to check it with"
                    summary.skipped.append(block)
                    continue
                if setup_failed is not None:
                    summary.failed.append(
                        (
                            block,
                            f"not run: the setup block {setup_failed} failed",
                        )
                    )
                    continue
                if kind == "python":
                    error = run_python(block.code, namespace, block)
                elif kind == "shell":
                    error = run_shell(block.code, ROOT if block.mark == "repo" else cwd, env, block)
                elif kind == "console":
                    commands = console_commands(block.code)
                    error = None if commands else "a console block with no `$ ` line"
                    for command in commands:
                        error = run_shell(
                            command, ROOT if block.mark == "repo" else cwd, env, block
                        )
                        if error:
                            error = f"$ {command}\n{error}"
                            break
                else:
                    error = compile_c(block, compilers[compile_kind], cwd)
                if error is None:
                    summary.run.append(block)
                else:
                    summary.failed.append((block, error))
                    if block.mark == "setup":
                        setup_failed = block.where()
        finally:
            os.chdir(here)


def main() -> int:
    global VERBOSE, TIMEOUT_S
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "files",
        nargs="*",
        type=Path,
        help="Markdown files (default: docs/**/*.md and README.md)",
    )
    parser.add_argument(
        "--stage",
        type=Path,
        help="the `stage` binary to put on PATH (e.g. target/debug/stage)",
    )
    parser.add_argument(
        "--cc",
        default=shutil.which("cc") or shutil.which("gcc"),
        help="C compiler for ```c blocks",
    )
    parser.add_argument(
        "--cxx",
        default=shutil.which("c++") or shutil.which("g++"),
        help="C++ compiler for ```cpp blocks",
    )
    parser.add_argument(
        "--timeout", type=int, default=TIMEOUT_S, help="seconds a shell block may run"
    )
    parser.add_argument(
        "--only",
        help="run only the blocks of these kinds, comma-separated (python, shell, console, c, cpp)",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="print what every block printed"
    )
    args = parser.parse_args()
    VERBOSE, TIMEOUT_S = args.verbose, args.timeout
    only = set(args.only.split(",")) if args.only else None
    known = set(RUN_AS.values()) | set(COMPILE_AS.values())
    if only is not None and not only <= known:
        print(
            f"docs_blocks: --only {args.only}: the kinds are {', '.join(sorted(known))}",
            file=sys.stderr,
        )
        return 2

    files = [f.resolve() for f in args.files] or sorted((ROOT / "docs").rglob("*.md")) + [
        ROOT / "README.md"
    ]
    env = dict(os.environ)
    bindir = Path(tempfile.mkdtemp(prefix="docs-blocks-bin-"))
    if args.stage is not None:
        stage = args.stage.resolve()
        if not stage.is_file():
            print(f"docs_blocks: --stage {args.stage}: no such file", file=sys.stderr)
            return 2
        (bindir / "stage").symlink_to(stage)
    env["PATH"] = (
        f"{bindir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    )
    env["STAGING_REPO"] = str(ROOT)
    os.environ["PATH"] = env["PATH"]
    os.environ["STAGING_REPO"] = str(ROOT)

    summary = Summary()
    try:
        for path in files:
            run_page(path, env, {"c": args.cc, "cpp": args.cxx}, summary, only)
    finally:
        shutil.rmtree(bindir, ignore_errors=True)

    print(
        f"docs blocks: {len(summary.run)} run, {len(summary.skipped)} skipped, {len(summary.failed)} failed"
    )
    not_run = ", ".join(f"{n} {lang}" for lang, n in sorted(summary.not_run.items()))
    if not_run:
        print(f"not run by this script: {not_run} (rust blocks run as doctests)")
    for block in summary.skipped:
        print(f"  skipped {block.where()} ({block.lang}): {block.reason or 'no reason given'}")
    for block, error in summary.failed:
        print(f"\nFAILED {block.where()} ({block.lang}):\n{error.rstrip()}")
    unreasoned = [b for b in summary.skipped if not b.reason]
    if unreasoned:
        print(
            f"\n{len(unreasoned)} skipped block(s) give no reason: say why in `<!-- docs: skip REASON -->`"
        )
    return 1 if summary.failed or unreasoned else 0


if __name__ == "__main__":
    sys.exit(main())
