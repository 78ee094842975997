"""eagle3lab.report.kernel: a kernel message whose wake-up was lost is found within a slice.

The lost wake-up is reproduced on real zmq sockets and jupyter_client's real Session and
channel: a message arrives, and the receiving socket's events are read before the event
loop looks (as zmq does on any call that touches the socket), which consumes the edge
pyzmq's asyncio poll waits for. jupyter_client's own channel then returns the message only
at its timeout; ours within one slice. Then a notebook runs through `execute_notebook`."""

from __future__ import annotations

import asyncio
import json
import time
from queue import Empty

import pytest
import zmq
import zmq.asyncio
from jupyter_client.channels import AsyncZMQSocketChannel
from jupyter_client.session import Session

from eagle3lab.report import kernel
from eagle3lab.report.kernel import SlicedPollChannel


async def _lost_edge(channel_class, *, timeout: float | None, send: bool = True,
                     at: float = 0.2) -> tuple[str | None, float]:
    """(the message type received or None for Empty, seconds the get_msg took)."""
    ctx = zmq.asyncio.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    a.bind("inproc://lost-edge")
    b.connect("inproc://lost-edge")
    session = Session()
    channel = channel_class(b, session)

    async def reply():
        await asyncio.sleep(at)
        session.send(a, "execute_reply", {"status": "ok"})
        zmq.Socket.shadow(b.underlying).get(zmq.EVENTS)  # consumes the fd's edge

    t0 = time.monotonic()
    task = asyncio.ensure_future(reply() if send else asyncio.sleep(0))
    try:
        got = (await channel.get_msg(timeout=timeout))["msg_type"]
    except Empty:
        got = None
    took = time.monotonic() - t0
    await task
    a.close(linger=0)
    b.close(linger=0)
    ctx.term()
    return got, took


def test_a_lost_edge_stalls_the_stock_channel_until_its_timeout():
    got, took = asyncio.run(_lost_edge(AsyncZMQSocketChannel, timeout=2.0))
    assert got == "execute_reply" and took >= 1.9  # the reply came at 0.2 s


@pytest.mark.parametrize("timeout", [5.0, None])
def test_the_sliced_channel_finds_it_within_a_slice(timeout):
    got, took = asyncio.run(_lost_edge(SlicedPollChannel, timeout=timeout))
    assert got == "execute_reply"
    assert took < 0.2 + kernel.POLL_SLICE_S + 0.5


def test_the_sliced_channel_still_times_out():
    got, took = asyncio.run(_lost_edge(SlicedPollChannel, timeout=1.2, send=False))
    assert got is None and 1.15 <= took < 2.0


def test_the_kernel_manager_hands_out_sliced_clients():
    km = kernel.KERNEL_MANAGER(kernel_name="python3")
    client = km.client()
    assert isinstance(client, kernel.SlicedPollKernelClient)
    for name in ("shell", "iopub", "stdin", "control"):
        assert getattr(client, f"{name}_channel_class") is SlicedPollChannel


@pytest.mark.slow
def test_a_notebook_runs_through_it(tmp_path):
    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
          "cells": [
              {"cell_type": "code", "id": "p", "metadata": {"tags": ["parameters"]},
               "execution_count": None, "outputs": [], "source": "n: int = 1  # a count"},
              {"cell_type": "code", "id": "c", "metadata": {}, "execution_count": None,
               "outputs": [], "source": "print('n squared', n * n)"}]}
    src, dst = tmp_path / "in.ipynb", tmp_path / "out.ipynb"
    src.write_text(json.dumps(nb))
    kernel.execute_notebook(str(src), str(dst), parameters={"n": 7}, kernel_name="python3",
                            progress_bar=False, execution_timeout=60)
    out = json.loads(dst.read_text())["cells"][-1]["outputs"]
    assert "".join(out[0]["text"]) == "n squared 49\n"
