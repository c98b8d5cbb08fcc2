"""Whole fetches (``distill.fetches``): batches keep fetch order and size, and a rebalance neither
loses a batch in flight nor lets a dropped record be processed.

The worker end to end (``test_stream.py``) shows that no event is lost or scored twice across
crashes; these pin down the hand-over between the consumer and the task that Kafka cannot time.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from faust.types import TP

from distill.fetches import Fetched, Fetches
from tests.distill.test_tuning import in_a_loop

EVENTS = "events"


@dataclass(frozen=True)
class Record:
    offset: int


def fetched(partition: int, first: int, last: int) -> Fetched:
    return Fetched(TP(EVENTS, partition), [Record(offset) for offset in range(first, last + 1)])


def offsets(batch: list[Fetched]) -> list[tuple[int, list[int]]]:
    return [(part.partition, [record.offset for record in part.records]) for part in batch]


@in_a_loop
async def test_batches_keep_fetch_order_and_split_a_partition_at_the_batch_size() -> None:
    fetches = Fetches([EVENTS], max_pending=100)
    fetches.put([fetched(0, 0, 2), fetched(1, 10, 14)])
    fetches.put([fetched(0, 3, 3)])
    async with fetches.batch(4) as batch:
        assert offsets(batch) == [(0, [0, 1, 2]), (1, [10])]
    async with fetches.batch(100) as batch:
        assert offsets(batch) == [(1, [11, 12, 13, 14]), (0, [3])]
    assert fetches.pending == 0


@in_a_loop
async def test_a_batch_waits_for_records() -> None:
    fetches = Fetches([EVENTS], max_pending=100)

    async def take() -> list[tuple[int, list[int]]]:
        async with fetches.batch(10) as batch:
            return offsets(batch)

    waiting = asyncio.ensure_future(take())
    await asyncio.sleep(0.01)
    assert not waiting.done()
    fetches.put([fetched(2, 5, 6)])
    assert await asyncio.wait_for(waiting, 1) == [(2, [5, 6])]


@in_a_loop
async def test_fetching_waits_while_too_many_records_are_pending() -> None:
    fetches = Fetches([EVENTS], max_pending=5)
    fetches.put([fetched(0, 0, 5)])
    room = asyncio.ensure_future(fetches.room())
    await asyncio.sleep(0.01)
    assert not room.done()
    async with fetches.batch(2):
        pass
    await asyncio.wait_for(room, 1)  # 4 left: below the bound


@in_a_loop
async def test_settling_drops_what_waits_and_waits_for_the_batch_in_flight() -> None:
    fetches = Fetches([EVENTS], max_pending=5)
    fetches.put([fetched(0, 0, 1), fetched(1, 0, 9)])
    log: list[str] = []
    release = asyncio.Event()

    async def process() -> None:
        async with fetches.batch(2) as batch:
            log.append(f"took {offsets(batch)}")
            await release.wait()
            log.append("done")

    processing = asyncio.ensure_future(process())
    await asyncio.sleep(0.01)
    room = asyncio.ensure_future(fetches.room())
    settling = asyncio.ensure_future(fetches.settle())
    await asyncio.sleep(0.01)
    assert not settling.done()  # the batch in flight is not done
    assert fetches.pending == 0  # what waited is dropped (Faust reads it again from the committed offset)
    await asyncio.wait_for(room, 1)  # and fetching goes on
    release.set()
    await asyncio.wait_for(settling, 1)
    await processing
    assert log == ["took [(0, [0, 1])]", "done"]


@in_a_loop
async def test_a_batch_waiting_for_the_lock_takes_nothing_a_settle_dropped() -> None:
    fetches = Fetches([EVENTS], max_pending=100)
    taken: list[list[tuple[int, list[int]]]] = []
    release = asyncio.Event()

    async def process(hold: bool = False) -> None:
        async with fetches.batch(1) as batch:
            taken.append(offsets(batch))
            if hold:
                await release.wait()

    fetches.put([fetched(0, 0, 0)])
    first = asyncio.ensure_future(process(hold=True))
    await asyncio.sleep(0.01)
    fetches.put([fetched(0, 1, 1)])
    second = asyncio.ensure_future(process())  # sees the record, waits for the batch in flight
    await asyncio.sleep(0.01)
    settling = asyncio.ensure_future(fetches.settle())  # drops it meanwhile
    await asyncio.sleep(0.01)
    release.set()
    await asyncio.wait_for(asyncio.gather(first, settling), 1)
    await asyncio.sleep(0.01)
    assert not second.done()  # nothing to take: it waits for the next fetch
    fetches.put([fetched(0, 7, 7)])
    await asyncio.wait_for(second, 1)
    assert taken == [[(0, [0])], [(0, [7])]]
