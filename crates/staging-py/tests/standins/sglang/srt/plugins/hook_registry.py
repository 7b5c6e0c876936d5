"""Stand-in for sglang.srt.plugins.hook_registry: AROUND hooks on a dotted target, applied once.
The real registry also has BEFORE/AFTER/REPLACE hooks and propagates patches to other modules."""

import functools
import pkgutil
from collections import defaultdict
from enum import Enum


class HookType(Enum):
    BEFORE = "before"
    AFTER = "after"
    AROUND = "around"
    REPLACE = "replace"


class HookRegistry:
    _hooks = defaultdict(list)
    _patched = set()

    @classmethod
    def register(cls, target, hook, hook_type=HookType.AFTER, *, source=None):
        cls._hooks[target].append((hook_type, hook))

    @classmethod
    def apply_hooks(cls):
        for target, hooks in cls._hooks.items():
            if target in cls._patched:
                continue
            owner_path, attr = target.rsplit(".", 1)
            owner = pkgutil.resolve_name(owner_path)
            wrapped = getattr(owner, attr)
            for hook_type, hook in hooks:
                if hook_type is not HookType.AROUND:
                    raise NotImplementedError("stand-in: AROUND hooks only")
                wrapped = _around(wrapped, hook)
            setattr(owner, attr, wrapped)
            cls._patched.add(target)

    @classmethod
    def reset(cls):
        cls._hooks.clear()
        cls._patched.clear()


def _around(original, hook):
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        return hook(original, *args, **kwargs)

    return wrapper
