"""Run a coroutine to completion from synchronous code, also inside Jupyter.

Prevents "asyncio.run() cannot be called from a running event loop": a notebook kernel
(papermill, Jupyter) runs an event loop in its main thread, so library functions that use
asyncio internally (the concurrent benchmark client, generation through a server) would
work from the CLI and fail in the notebooks. Where a loop is running in this thread, the
coroutine runs in a fresh loop on a worker thread and its result (or exception) comes back.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Coroutine


def run(coro: Coroutine) -> Any:
    """`asyncio.run(coro)`, or the same on a worker thread when a loop is running here."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = asyncio.run(coro)
        except BaseException as e:  # handed to the caller's thread
            box["error"] = e

    t = threading.Thread(target=target, name="eagle3lab-asyncio")
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box.get("result")
