"""Several distiller workers in one group, coming and going under steady load (the real worker processes,
broker and database, as in ``test_stream.py``): nothing is lost and nothing is stored twice."""

from __future__ import annotations

import time

import pytest

from tests.distill.stream_harness import MakeHarness, SteadyLoad, assert_one_sample_per_generation

EVENTS = "liveloop_distill_events_total"


@pytest.mark.timeout(420)
def test_three_workers_one_joining_one_killed_one_leaving_lose_nothing(make_harness: MakeHarness) -> None:
    """Two workers share the stream; mid-stream a third joins, the second is SIGKILLed (its partitions move only
    once the group notices it gone, with whatever it processed but had not committed) and the third leaves
    cleanly. Every generation sent gets exactly one sample, under one sample id, and the group's committed
    offsets reach the end of every events partition."""
    harness = make_harness(name="scaleout", partitions=6)
    harness.start()
    harness.wait_ready()
    load = SteadyLoad(harness, "scaleout", per_tick=60).start()  # 300 sessions a second for about a minute
    try:
        second = harness.start_member("second")
        harness.wait_until(lambda: second.metric(EVENTS) > 0, 120, "the second worker to take events")
        time.sleep(2.0)
        third = harness.start_member("third")  # joins
        harness.wait_until(lambda: third.metric(EVENTS) > 0, 120, "the third worker to take events")
        time.sleep(2.0)
        second.kill()
        time.sleep(12.0)  # its partitions move once the group sees its session time out (8 s in the harness)
        assert third.stop() == 0  # leaves the group: its partitions go back to the first worker
        time.sleep(2.0)
    finally:
        load.stop()
    harness.wait_for_samples(len(load.sent), timeout=180, stable_s=2.0)
    assert_one_sample_per_generation(harness, load.sent)
    assert harness.stop() == 0
