"""Time slices and the gateway's runtime settings: a burst of work spreads over loop iterations, so timers and sockets
are served in between; no collector or thread switch holds the loop for long."""

from __future__ import annotations

import asyncio
import time

import pytest
import uvloop

from polar.slices import TimeSlices


async def _burst(pieces: int, piece_s: float) -> list[str]:
    """``pieces`` tasks, each taking its turn and then holding the loop for ``piece_s``, and a timer due at once."""
    slices = TimeSlices(slice_s=0.005)
    log: list[str] = []

    async def work(i: int) -> None:
        await slices.turn()
        time.sleep(piece_s)  # a piece of synchronous work: decoding, planning, parsing
        log.append(f"work {i}")

    tasks = [asyncio.create_task(work(i)) for i in range(pieces)]
    asyncio.get_running_loop().call_later(0, log.append, "timer")
    await asyncio.gather(*tasks)
    return log


@pytest.mark.parametrize("new_loop", [asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"])
def test_a_timer_due_during_a_burst_runs_after_a_few_pieces_not_after_all(new_loop):
    with asyncio.Runner(loop_factory=new_loop) as runner:
        log = runner.run(_burst(200, 0.002))
    # Without slices all 200 pieces (0.4 s) run in the first iteration, before the timer: here a 5 ms slice
    # holds about three 2 ms pieces.
    assert log.index("timer") <= 10
    # The work is neither dropped nor reordered.
    assert [entry for entry in log if entry != "timer"] == [f"work {i}" for i in range(200)]


def test_turns_within_the_slice_do_not_yield():
    async def main() -> int:
        slices = TimeSlices(slice_s=60.0)
        for _ in range(1000):
            await slices.turn()
        return slices.deferred

    assert asyncio.run(main()) == 0


def test_the_gateway_runtime_freezes_start_up_and_switches_threads_every_millisecond():
    import gc
    import sys

    from polar.proxy.server import tune_runtime

    thresholds, interval = gc.get_threshold(), sys.getswitchinterval()
    try:
        tune_runtime()
        assert gc.get_freeze_count() > 0  # start-up's objects are out of the collector's sight
        assert gc.get_threshold()[0] == 50_000 and sys.getswitchinterval() == 0.001
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
        sys.setswitchinterval(interval)
