"""A turn's decode against the length of its history: whole, on the previous body's digests, and cut on its bytes.

An agent re-sends its whole conversation every turn. This decodes one turn (two new messages) of the benchmarks'
agent conversation at several lengths, in this process, three ways, each the median of many runs:

- ``orjson.loads`` of the whole body: what any gateway that reads the body pays (the minimal token-in gateway's
  parse), and what grows with the history;
- ``parse_json_after`` on the previous body's digests with no place kept (``RawHead``): the body decoded whole,
  only its new messages checked and digested (the path before the cut, and still the path of a client that does
  not write compact JSON);
- ``parse_json_after`` cut on the previous body's bytes (``CutBody``): one digest of the repeated bytes, then only
  what follows decoded, checked and digested;

and beside them the floor of a cut decode: ``orjson.loads`` of the turn's new messages alone.

    .venv/bin/python benchmarks/bench_cut_decode.py [--turns 9,209,1009]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable

import orjson
from gateway_support import chat_body, conversation

from polar.wire.json_guard import parse_json_after


def timed_us(fn: Callable[[], object], budget_s: float = 0.3) -> float:
    """The median of rounds of ``fn`` over about ``budget_s``, in microseconds."""
    fn()
    runs: list[float] = []
    deadline = time.perf_counter() + budget_s
    while time.perf_counter() < deadline or len(runs) < 5:
        started = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - started)
    return statistics.median(runs) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", default="9,209,1009", help="tool round trips in the history, comma-separated")
    args = parser.parse_args()
    print(
        f"{'messages':>8} {'body KB':>8} {'whole loads us':>14} {'on digests us':>13} {'cut us':>7} "
        f"{'new loads us':>12} {'cut / whole loads':>17} {'cut / new loads':>15}"
    )
    for turns in map(int, args.turns.split(",")):
        row(turns)


def row(turns: int) -> None:
    """One line: the turn after ``turns`` tool round trips, decoded each way."""
    messages = conversation(turns)
    earlier = orjson.dumps(chat_body(messages[:-2], max_tokens=64))
    raw = orjson.dumps(chat_body(messages, max_tokens=64))
    prior = parse_json_after(earlier, digests=True, key="messages").digest
    assert prior is not None and prior.head is not None
    placeless = dataclasses.replace(prior, head=None)
    cut = parse_json_after(raw, checked=prior, digests=True, key="messages")
    assert cut.cut is not None and cut.cut.count == len(messages) - 2
    new = orjson.dumps(messages[-2:])
    whole_us = timed_us(lambda: orjson.loads(raw))
    digests_us = timed_us(lambda: parse_json_after(raw, checked=placeless, digests=True))
    cut_us = timed_us(lambda: parse_json_after(raw, checked=prior, digests=True, key="messages"))
    new_us = timed_us(lambda: orjson.loads(new))
    print(
        f"{len(messages):>8} {len(raw) / 1024:>8.0f} {whole_us:>14.0f} {digests_us:>13.0f} {cut_us:>7.0f} "
        f"{new_us:>12.1f} {cut_us / whole_us:>17.2f} {cut_us / new_us:>15.1f}"
    )


if __name__ == "__main__":
    main()
