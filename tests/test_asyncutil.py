"""asyncutil.run works where asyncio.run cannot: inside a running event loop (a notebook
kernel), returning the result and re-raising the exception in the caller's thread."""

import asyncio

import pytest

from eagle3lab import asyncutil


async def _value(x):
    await asyncio.sleep(0)
    return x


async def _fails():
    raise ValueError("from the coroutine")


def test_run_outside_and_inside_a_running_loop():
    assert asyncutil.run(_value(1)) == 1

    async def kernel():  # like Jupyter: a loop runs in this thread
        with pytest.raises(RuntimeError, match="running event loop"):
            _asyncio_run_here()  # what the notebook failed with
        assert asyncutil.run(_value(2)) == 2
        with pytest.raises(ValueError, match="from the coroutine"):
            asyncutil.run(_fails())
        return True

    assert asyncio.run(kernel())


def _asyncio_run_here():
    coro = _value(0)
    try:
        asyncio.run(coro)
    finally:
        coro.close()
