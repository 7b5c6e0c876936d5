#!/usr/bin/env python3
"""safetensors' own Python tests, run on `safetensors` and on this drop-in, compared test by test.

The tests are those of the `safetensors` source distribution (`bindings/python/tests`), the
files for torch and NumPy. They run twice, each time from a fresh copy of their directory (they
write files under `./tests/data`), in a child `pytest`:

1. on `safetensors` itself, as installed;
2. on `safetensors_staging`, through an import shim: a `sys.meta_path` finder, installed before
   anything is imported, that answers `import safetensors` and `import safetensors.X` with
   `safetensors_staging` and `safetensors_staging.X` (the tests' own text is unchanged).

Every test that passes on `safetensors` must pass on the drop-in; the run fails (exit 1) and
names each one that does not. Tests that fail or are skipped on `safetensors` itself on this
machine (a missing optional package, a GPU) are reported, not required.

Usage:

    python .ci/safetensors_suite.py --tests DIR  # bindings/python/tests of the sdist
    python .ci/safetensors_suite.py --sdist safetensors-0.8.0.tar.gz
    python .ci/safetensors_suite.py --pypi 0.8.0  # that sdist, fetched from PyPI

`--pypi` asks the package index (`PIP_INDEX_URL`, else PyPI) for the version's sdist and checks its SHA-256: a plain download
(`pip download --no-binary :all:` builds the sdist's metadata, compiling its build tool, maturin,
from source: 8 minutes on CI's machine).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Dict, List

# The files whose tests need nothing beyond torch and NumPy (the others: TensorFlow, Flax,
# Paddle, MLX).
FILES = [
    "test_simple.py",
    "test_pt_comparison.py",
    "test_pt_model.py",
    "test_threadable.py",
    "test_handle.py",
    "test_multithreaded.py",
    "test_pread_backend.py",
]

# Loaded into the drop-in's pytest with `-p`: the shim, in place before a test file imports.
SHIM = '''
import importlib
import importlib.abc
import importlib.util
import sys


class _Shim(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`safetensors[.X]` answered with `safetensors_staging[.X]`."""

    def find_spec(self, name, path=None, target=None):
        if name == "safetensors" or name.startswith("safetensors."):
            return importlib.util.spec_from_loader(name, self)
        return None

    def create_module(self, spec):
        return importlib.import_module("safetensors_staging" + spec.name[len("safetensors"):])

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Shim())
'''


def outcomes(xml: Path) -> Dict[str, str]:
    """`{test id: passed | failed | skipped}` from pytest's JUnit XML."""
    out: Dict[str, str] = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = f"{case.get('classname')}.{case.get('name')}"
        tags = {child.tag for child in case}
        if "skipped" in tags:
            out[name] = "skipped"
        elif tags & {"failure", "error"}:
            out[name] = "failed"
        else:
            out[name] = "passed"
    return out


def run(tests: Path, shim: bool, work: Path) -> Dict[str, str]:
    # The tests run from `bindings/python` (they write `./tests/data/...`): a copy of their
    # directory under a fresh one, theirs and ours apart.
    here = work / ("drop-in" if shim else "safetensors")
    shutil.copytree(tests, here / "tests")
    xml = here / "junit.xml"
    env = dict(os.environ)
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}"]
    # A file that cannot be imported is its tests failed, not the end of the run.
    argv += ["--continue-on-collection-errors"]
    if shim:
        (work / "shim").mkdir(exist_ok=True)
        (work / "shim" / "staging_shim.py").write_text(SHIM)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(work / "shim"), env.get("PYTHONPATH", "")) if p
        )
        argv += ["-p", "staging_shim"]
    argv += [f"tests/{f}" for f in FILES if (tests / f).exists()]
    argv += ["--rootdir", str(here)]
    done = subprocess.run(argv, cwd=here, env=env, capture_output=True, text=True)
    tail = "\n".join(done.stdout.strip().splitlines()[-1:])
    print(f"{'drop-in' if shim else 'safetensors'}: {tail}")
    if not xml.exists():
        print(done.stdout[-4000:], done.stderr[-4000:], sep="\n")
        raise SystemExit("pytest wrote no report")
    return outcomes(xml)


def fetch_sdist(version: str, into: Path) -> Path:
    """safetensors' sdist of `version`, from the package index pip would ask (`PIP_INDEX_URL`,
    else PyPI) in its JSON form (PEP 691), its SHA-256 checked against the index's."""
    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
    page = f"{index}/safetensors/"
    request = urllib.request.Request(
        page, headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=60) as r:
        files = json.load(r)["files"]
    name = f"safetensors-{version}.tar.gz"
    sdists = [f for f in files if f["filename"] == name]
    if not sdists:
        raise SystemExit(f"{page} lists no {name}")
    sha256 = sdists[0].get("hashes", {}).get("sha256")
    if not sha256:
        raise SystemExit(f"{page}: no SHA-256 for {name} to check it against")
    url = urllib.parse.urljoin(page, sdists[0]["url"])
    with urllib.request.urlopen(url, timeout=300) as r:
        data = r.read()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise SystemExit(f"{url}: its SHA-256 is not the one the index lists")
    path = into / name
    path.write_bytes(data)
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--tests", type=Path, help="safetensors' bindings/python/tests")
    src.add_argument("--sdist", type=Path, help="safetensors' source distribution (.tar.gz)")
    src.add_argument("--pypi", metavar="VERSION", help="that version's sdist, fetched from PyPI")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        tests = args.tests
        sdist = fetch_sdist(args.pypi, work) if args.pypi else args.sdist
        if tests is None:
            with tarfile.open(sdist) as tar:
                members = [m for m in tar.getmembers() if "/bindings/python/tests/" in m.name]
                tar.extractall(work / "sdist", members=members, filter="data")
            found = list((work / "sdist").glob("*/bindings/python/tests"))
            if not found:
                raise SystemExit(f"{sdist}: no bindings/python/tests in it")
            tests = found[0]
        theirs = run(tests.resolve(), False, work)
        ours = run(tests.resolve(), True, work)
    required = sorted(t for t, o in theirs.items() if o == "passed")
    broken: List[str] = [
        f"{t}: {ours.get(t, 'not run')}" for t in required if ours.get(t) != "passed"
    ]
    extra = sorted(t for t, o in ours.items() if o == "passed" and theirs.get(t) != "passed")
    counts = {o: sum(1 for v in theirs.values() if v == o) for o in ("passed", "failed", "skipped")}
    print(
        f"safetensors itself: {counts['passed']} passed, {counts['failed']} failed, "
        f"{counts['skipped']} skipped; the drop-in passes {len(required) - len(broken)} of the "
        f"{len(required)} that pass there"
        + (f" (and {len(extra)} that do not: {', '.join(extra)})" if extra else "")
    )
    for t, o in sorted(theirs.items()):
        if o != "passed":
            print(f"  not required ({o} on safetensors itself): {t}")
    if broken:
        print("!! the drop-in fails where safetensors passes:")
        for line in broken:
            print(f"  {line}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
