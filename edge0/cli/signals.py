"""SIGTERM handled as Ctrl-C by every command: what SIGINT's handler does then, SIGTERM does too.

Under asyncio's runner (`edge0 run` streaming, `edge0 serve` has its own) SIGINT's handler
cancels the main task, so the engine closes as on Ctrl-C; elsewhere it raises
KeyboardInterrupt, so a conversion removes its partial output. Either way the command
ends as an interrupted one (exit code 130).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

INTERRUPTED = 130  # 128 + SIGINT: the shell's code for a command stopped by Ctrl-C


def _as_ctrl_c(signum: int, frame: FrameType | None) -> None:
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)  # the runner's (cancel the main task) or Python's
    else:  # SIGINT ignored or default (a background job): stop anyway
        raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """SIGTERM does what Ctrl-C does inside the block (main thread only; restored after)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _as_ctrl_c)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
