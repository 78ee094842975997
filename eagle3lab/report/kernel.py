"""The notebook kernel's client, polling its sockets in short slices.

Prevents a notebook run that stalls for a whole cell timeout (20 minutes in `make demo`,
forever where no timeout is set) on a cell that has already finished. jupyter_client's
asyncio channels wait for a message with ONE `socket.poll(timeout)`, and pyzmq wakes that
poll only on an edge of the socket's notification fd. Anything that reads the socket's
events between the message's arrival and the event loop's look (zmq processes its
commands on any such call) consumes the edge: the reply then sits in the socket until the
timeout's final check finds it. nbclient waits on the shell channel with the cell's whole
timeout and on the iopub channel with none. Seen in this project's suite: notebook 05's
widget cell sat 600 s, then 20 min without a timeout, with the kernel idle
(tests/report/test_kernel.py reproduces the lost edge on a real socket).

`SlicedPollChannel.get_msg` polls in slices of `POLL_SLICE_S`: each new poll looks at the
socket's events at once, so a missed edge costs at most one slice. `KERNEL_MANAGER` is the
kernel manager whose clients use it; `execute_notebook` is papermill's, with it.
"""

from __future__ import annotations

import time
from queue import Empty
from typing import Any

from jupyter_client.asynchronous.client import AsyncKernelClient
from jupyter_client.channels import AsyncZMQSocketChannel
from jupyter_client.manager import AsyncKernelManager
from traitlets import DottedObjectName, Type

#: seconds a single poll of a kernel socket waits before looking again.
POLL_SLICE_S = 0.5


class SlicedPollChannel(AsyncZMQSocketChannel):
    """An asyncio kernel channel whose `get_msg` polls in slices of `POLL_SLICE_S`."""

    async def get_msg(self, timeout: float | None = None) -> dict[str, Any]:  # type: ignore[override]
        assert self.socket is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            step = POLL_SLICE_S if left is None else min(POLL_SLICE_S, left)
            if await self.socket.poll(int(step * 1000)):
                return await self._recv()
            if left is not None and left <= step:
                raise Empty


class SlicedPollKernelClient(AsyncKernelClient):
    """jupyter_client's asyncio kernel client with `SlicedPollChannel` channels."""

    shell_channel_class = Type(SlicedPollChannel)  # type: ignore[assignment]
    iopub_channel_class = Type(SlicedPollChannel)  # type: ignore[assignment]
    stdin_channel_class = Type(SlicedPollChannel)  # type: ignore[assignment]
    control_channel_class = Type(SlicedPollChannel)  # type: ignore[assignment]


class SlicedPollKernelManager(AsyncKernelManager):
    """jupyter_client's asyncio kernel manager handing out `SlicedPollKernelClient`s."""

    client_class: DottedObjectName = DottedObjectName(
        f"{__name__}.SlicedPollKernelClient", config=True)
    client_factory: Type = Type(SlicedPollKernelClient, klass=AsyncKernelClient, config=True)


KERNEL_MANAGER = SlicedPollKernelManager


def execute_notebook(src: str, dst: str, **kwargs: Any) -> Any:
    """`papermill.execute_notebook(src, dst, **kwargs)` with `KERNEL_MANAGER` (nbclient's
    `kernel_manager_class`); what papermill returns or raises."""
    import papermill as pm

    return pm.execute_notebook(src, dst, kernel_manager_class=KERNEL_MANAGER, **kwargs)
