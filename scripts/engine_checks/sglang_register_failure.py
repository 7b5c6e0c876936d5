"""A `register` that cannot hook (here: SGLang's HookRegistry refusing) fails loudly: SGLang only
logs a plugin's exception, so ours names the SGLang version and what failed, and `staging` is
not offered without the hook (SGLang's own "invalid choice", not a half-registered format)."""

import contextlib
import io
import logging

from sglang.srt.plugins.hook_registry import HookRegistry


def refuse(*args, **kwargs):
    raise AttributeError("HookRegistry refused (a stand-in failure)")


HookRegistry.register = classmethod(refuse)
log = io.StringIO()
logging.getLogger("sglang.srt.plugins").addHandler(logging.StreamHandler(log))
from sglang.srt.plugins import load_plugins  # noqa: E402 (after HookRegistry is made to refuse)

load_plugins()
failure = [line for line in log.getvalue().splitlines() if line.startswith("RuntimeError")]
assert (
    failure and "cannot register load format 'staging' with this SGLang (sglang 0.5" in failure[0]
), log.getvalue()
print("register failing, as SGLang logs it:", failure[0][:220])
from sglang.srt.server_args import prepare_server_args  # noqa: E402 (after load_plugins(), as before)

err = io.StringIO()
with contextlib.redirect_stderr(err):
    try:
        prepare_server_args(["--model-path", "m", "--load-format", "staging"])
    except SystemExit:
        pass
    else:
        raise AssertionError("--load-format staging was offered without its hook")
print(
    "then --load-format staging:",
    [line for line in err.getvalue().splitlines() if "invalid choice" in line][0][:120],
    "...",
)
