"""Stand-in for sglang.srt.runtime_context: `get_server_args()`, the arguments of the server
running in this process (`_server_args`, None until a test sets it; the real one is published
when the server starts)."""

_server_args = None


def get_server_args():
    return _server_args
