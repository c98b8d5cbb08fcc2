"""The distiller's Faust tuning: a record's delivery runs eagerly and is abandoned exactly as Faust abandons it.

``step_eagerly`` must behave as a task would (results, exceptions, waits, cancellation), and
``EagerDelivery.wait_first`` as Faust's race (``mode.Service.wait_first``): a delivery that waits
still loses to a rebalance (``suspend_flow``), and one that does not never waits for anything.
"""

from __future__ import annotations

import asyncio
import functools
import warnings
from collections.abc import Callable, Coroutine
from importlib.metadata import version
from typing import Any

import faust
import pytest
from mode.utils.locks import Event

from distill.errors import UnsupportedEngine
from distill.tuning import FAUST_VERSION, EagerDelivery, install, step_eagerly


def in_a_loop(check: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    """A test that runs ``check`` in a fresh event loop."""

    @functools.wraps(check)
    def test() -> None:
        asyncio.run(check())

    return test


async def _immediate(log: list[str]) -> str:
    log.append("ran")
    return "done"


async def _waits_for(future: asyncio.Future[int], log: list[str]) -> int:
    log.append("before")
    try:
        value = await future
    except asyncio.CancelledError:
        log.append("cancelled")
        raise
    await asyncio.sleep(0)  # a bare yield too
    log.append("after")
    return value * 2


async def _fails_at_once() -> None:
    raise ValueError("bad record")


@in_a_loop
async def test_a_coroutine_that_never_waits_finishes_in_its_first_step() -> None:
    log: list[str] = []
    assert step_eagerly(_immediate(log)) == (True, "done")
    assert log == ["ran"]


@in_a_loop
async def test_an_exception_in_the_first_step_propagates() -> None:
    with pytest.raises(ValueError, match="bad record"):
        step_eagerly(_fails_at_once())


@in_a_loop
async def test_a_coroutine_that_waits_goes_on_from_where_it_stopped() -> None:
    log: list[str] = []
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    finished, rest = step_eagerly(_waits_for(future, log))
    assert not finished
    assert log == ["before"]  # the first step ran, once
    task = asyncio.ensure_future(rest)
    await asyncio.sleep(0)
    assert not task.done()
    future.set_result(21)
    assert await task == 42
    assert log == ["before", "after"]


@in_a_loop
async def test_cancelling_the_rest_cancels_the_coroutine_where_it_waits() -> None:
    log: list[str] = []
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    _, rest = step_eagerly(_waits_for(future, log))
    task = asyncio.ensure_future(rest)
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert log == ["before", "cancelled"]


class _Fetcher(EagerDelivery):
    """A bare service with the eager race, as the distiller's consumer has it."""


@in_a_loop
async def test_a_delivery_that_does_not_wait_is_not_raced() -> None:
    service = _Fetcher()
    suspend = Event()
    log: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a coroutine left unawaited (the race's other side) would warn
        result = await service.wait_first(_immediate(log), suspend.wait())
    assert log == ["ran"]
    assert result.results == ["done"]
    assert not result.stopped


@in_a_loop
async def test_a_waiting_delivery_still_finishes() -> None:
    service = _Fetcher()
    suspend = Event()
    log: list[str] = []
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_later(0.01, future.set_result, 5)
    result = await service.wait_first(_waits_for(future, log), suspend.wait())
    assert result.results == [10]
    assert log == ["before", "after"]


@in_a_loop
async def test_a_waiting_delivery_is_abandoned_when_the_flow_is_suspended() -> None:
    """A rebalance sets ``suspend_flow`` while a delivery waits (a full buffer, say): the delivery is
    cancelled, never completed, as in Faust's race."""
    service = _Fetcher()
    suspend = Event()
    log: list[str] = []
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_later(0.01, suspend.set)
    result: Any = await service.wait_first(_waits_for(future, log), suspend.wait())
    await asyncio.sleep(0)  # let the cancelled delivery run its handler
    assert result.results == [True]  # suspend.wait() won
    assert log == ["before", "cancelled"]


def test_the_distillers_producer_is_idempotent_with_acks_all() -> None:
    """Faust makes its producer idempotent only inside transactions; the tuned one always is (no broker needed:
    the aiokafka producer is built, never started)."""
    import faust

    from distill import tuning

    app = faust.App("tuning-producer-test", broker="kafka://127.0.0.1:1,127.0.0.1:2")
    tuning.install(app, 0.05)

    async def build() -> tuple[bool, list[str]]:
        producer = app.producer._new_producer()  # type: ignore[attr-defined]
        try:
            # aiokafka keeps a transaction manager (producer id and sequence numbers) exactly when idempotent.
            return producer._txn_manager is not None, producer.client._bootstrap_servers
        finally:
            await producer.stop()

    idempotent, servers = asyncio.run(build())
    assert idempotent
    assert servers == ["127.0.0.1:1", "127.0.0.1:2"]


def test_the_tuned_consumer_refuses_an_app_that_starts_unread_partitions_at_their_end() -> None:
    """``distill.tuning`` seeks a partition with nothing committed to its beginning after a rebalance (what the
    consumer would read from there): an app configured to start at the end instead is refused, with the fix."""
    app = faust.App("test-tuning-latest", broker="kafka://127.0.0.1:1", consumer_auto_offset_reset="latest")
    with pytest.raises(UnsupportedEngine, match="must be 'earliest'"):
        install(app, 0.05)


def test_the_tuned_consumer_runs_on_the_faust_streaming_release_it_was_checked_against() -> None:
    """The installed faust-streaming is the one ``distill.tuning`` names (constraints.txt pins it), so the check
    passes here, and the app gets the tuned consumer."""
    assert version("faust-streaming") == FAUST_VERSION
    app = faust.App("test-tuning-earliest", broker="kafka://127.0.0.1:1")
    install(app, 0.05)
    assert app.transport.Consumer.__name__ == "Consumer"
    assert hasattr(app.transport.Consumer, "_seek_back")
