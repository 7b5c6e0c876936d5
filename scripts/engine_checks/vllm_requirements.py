"""vLLM's requirements, one a line as pip takes them (`pip install -r`), all but flashinfer-python.

For when pip cannot install vLLM with its dependencies (seen with vLLM 0.34.0, 2026-12-04: it pins
flashinfer-python==0.7.3, which PyPI does not have): scripts/check-vllm.sh then installs vLLM
without them, and each of its requirements from this list but flashinfer-python (GPU kernels:
nothing in the check runs them).
"""

from importlib.metadata import requires

from pip._vendor.packaging.requirements import Requirement

for line in requires("vllm") or []:
    r = Requirement(line)
    if r.name != "flashinfer-python" and (r.marker is None or r.marker.evaluate({"extra": ""})):
        extras = f"[{','.join(sorted(r.extras))}]" if r.extras else ""
        print(f"{r.name}{extras}{r.specifier}")
