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


def test_a_long_line_is_woken_a_batch_at_a_time_not_all_of_it_every_iteration():
    async def main() -> tuple[int, int]:
        slices = TimeSlices(slice_s=0.005, batch=16)

        async def work() -> None:
            await slices.turn()
            time.sleep(0.002)

        await asyncio.gather(*(work() for _ in range(300)))
        return slices.deferred, slices.woken

    deferred, woken = asyncio.run(main())
    # Every iteration runs at least one piece, so there are at most 300 of them (about 120 at 2.5 pieces per 5 ms
    # slice). Callers that polled resumed the whole line every iteration (~300 * 120 / 2 = 18,000 resumptions, and
    # more on a slower machine); a batch of 16 per iteration is at most 16 * 300 however slow the machine.
    assert deferred >= 290 and woken <= 16 * 300


def test_a_caller_cancelled_in_line_holds_up_no_one():
    async def main() -> list[int]:
        slices = TimeSlices(slice_s=0.0)  # one piece per iteration: the others wait in line
        done: list[int] = []

        async def work(i: int) -> None:
            await slices.turn()
            done.append(i)

        tasks = [asyncio.create_task(work(i)) for i in range(5)]
        await asyncio.sleep(0)  # work 0 went; 1 to 4 are in line
        tasks[1].cancel()  # the first in line
        tasks[3].cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return done

    assert asyncio.run(main()) == [0, 2, 4]


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
        assert gc.get_threshold() == (5_000, 5, 1000) and sys.getswitchinterval() == 0.001
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
        sys.setswitchinterval(interval)
