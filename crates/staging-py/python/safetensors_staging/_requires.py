"""The frameworks the package does not depend on (PyTorch, JAX): where a call needs one that is
not installed, an ImportError that names the fix, `pip install torch (the [torch] extra of
safetensors-staging)`."""

from __future__ import annotations

import importlib
from types import ModuleType

# A framework's top-level module -> its name, and the extra of this package that installs it.
# The fix names the pip requirement itself: the extra's name on an index may not be this
# package when it was installed from a checkout (`pip install './crates/staging-py[torch]'`).
FRAMEWORKS = {"torch": ("PyTorch", "torch", "torch"), "jax": ("JAX", "jax", "flax")}


def missing(error: ModuleNotFoundError, module: str, needed_by: str) -> None:
    """Raises, in place of `error`, the error that names the fix when what was not found is
    `module` (or a package above it) of a framework of `FRAMEWORKS`; returns otherwise (a module
    the framework imports is missing: the caller re-raises `error` as it was).

    Args:
        error: what `import MODULE` raised.
        module: the module imported (`"torch"`, `"jax.numpy"`).
        needed_by: what the caller called, for the message (`safetensors_staging.torch`).

    Raises:
        ModuleNotFoundError: "NEEDED_BY needs PyTorch, which is not installed: pip install
            torch (the [torch] extra of safetensors-staging)" (its `name` the framework's
            top-level module), caused by `error`.
    """
    top = module.partition(".")[0]
    named = error.name or ""
    if top in FRAMEWORKS and (module == named or module.startswith(named + ".")):
        name, requirement, extra = FRAMEWORKS[top]
        raise ModuleNotFoundError(
            f"{needed_by} needs {name}, which is not installed: "
            f"pip install {requirement} (the [{extra}] extra of safetensors-staging)",
            name=top,
        ) from error


def need(module: str, needed_by: str) -> ModuleType:
    """`module` (`"torch"`, `"jax.numpy"`), imported for `needed_by`.

    Raises:
        ModuleNotFoundError: its framework is not installed; the message names the extra that
            installs it (see `missing`).
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        missing(error, module, needed_by)
        raise
