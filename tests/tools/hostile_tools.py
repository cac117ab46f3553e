"""Tool plugins that misbehave, for tests/tools/test_pool.py (loaded as a plugin file by its path)."""

import os
import time

from mindgrpo.tools import register_tool

NO_ARGS = {"type": "object", "properties": {}}


@register_tool("sleeper", description="sleeps far past any timeout", parameters=NO_ARGS)
def sleeper():
    time.sleep(600)
    return "woke up"


@register_tool("crasher", description="its process dies", parameters=NO_ARGS)
def crasher():
    os._exit(7)


@register_tool("flood", description="answers 10 MB", parameters=NO_ARGS)
def flood():
    return "x" * (10 << 20)


@register_tool("raiser", description="raises", parameters=NO_ARGS)
def raiser():
    raise KeyError("missing thing")


@register_tool("echo", description="returns its argument as JSON",
               parameters={"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
def echo(n, *, scale: int = 1):
    return {"n": n * scale, "pid": os.getpid()}
