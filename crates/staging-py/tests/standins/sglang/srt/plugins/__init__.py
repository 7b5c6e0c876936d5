"""Stand-in for sglang.srt.plugins: `load_plugins` calls each function of the entry-point group
`sglang.srt.plugins` once per process, then applies the hooks they registered."""

from importlib.metadata import entry_points

from sglang.srt.plugins.hook_registry import HookRegistry

GENERAL_PLUGINS_GROUP = "sglang.srt.plugins"
_plugins_loaded = False


def load_plugins():
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for ep in entry_points(group=GENERAL_PLUGINS_GROUP):
        ep.load()()
    HookRegistry.apply_hooks()
