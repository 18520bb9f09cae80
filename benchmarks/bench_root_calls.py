"""Root calls in a long session: a harness's side calls (a title, a topic, a check of each shell command) are new
conversations in the session of the agent's main one, and each is admitted against every call the session knows.

    .venv/bin/python benchmarks/bench_root_calls.py [--roots 400] [--main-turns 20]

One session first makes ``--main-turns`` turns of an agent conversation with tool calls, then ``--roots`` side
calls (a system prompt and one user message each, no tools). Printed: the gateway's CPU per side call
(``/proc/<pid>/task/*/schedstat``) at the first ten and the last ten, and, as the baseline, the first ten side calls
of a second session made between the long session's last ones (the same process state and machine load): the
ratio is what the session's length alone costs a root call.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
import orjson

from benchmarks.agent_sessions import TOOLS, call, open_session, start_backend, start_gateway
from benchmarks.gateway_support import Server

SYSTEM = {"role": "system", "content": "Say in one line whether this shell command only reads files."}


async def side_call(client: httpx.AsyncClient, gw: Server, key: str, i: int) -> float:
    body = {"model": "tiny", "messages": [SYSTEM, {"role": "user", "content": f"ls -la src/module_{i}"}]}
    before = gw.run_s()
    await call(client, gw.url, orjson.dumps({**body, "max_tokens": 8}), key)
    return gw.run_s() - before


async def main_turns(client: httpx.AsyncClient, gw: Server, key: str, turns: int) -> None:
    messages: list[dict] = [{"role": "user", "content": "Fix the failing test in the parser."}]
    for turn in range(turns):
        reply = await call(client, gw.url, orjson.dumps({"model": "tiny", "messages": messages, "tools": TOOLS}), key)
        said = reply["choices"][0]["message"]
        messages.append({k: v for k, v in said.items() if v is not None})
        for tool_call in said.get("tool_calls") or ():
            messages.append({"role": "tool", "tool_call_id": tool_call["id"], "content": f"output {turn}"})
        if not said.get("tool_calls"):
            messages.append({"role": "user", "content": f"go on ({turn})"})


async def run(args: argparse.Namespace) -> None:
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        backend = start_backend(stack, tmp, 32_768)
        gw = start_gateway(stack, tmp, "gateway", backend, f"sqlite:///{tmp / 'gateway' / 'polar.db'}")
        async with httpx.AsyncClient(timeout=60) as client:
            key, beside_key = await open_session(client, gw), await open_session(client, gw)
            await main_turns(client, gw, key, args.main_turns)
            took = [await side_call(client, gw, key, i) for i in range(args.roots - 10)]
            beside = []
            for i in range(args.roots - 10, args.roots):  # the long session's last ten, a fresh one's first ten
                took.append(await side_call(client, gw, key, i))
                beside.append(await side_call(client, gw, beside_key, i))
    first, last, fresh = (statistics.median(x) * 1e3 for x in (took[:10], took[-10:], beside))
    print(f"== {args.roots} side calls in one session after {args.main_turns} agent turns (gateway CPU per call) ==")
    print(f"side calls 1-10: {first:.2f} ms; the last 10: {last:.2f} ms ({last / first:.2f}x)")
    print(f"a second session's first 10, beside the last: {fresh:.2f} ms; last / beside {last / fresh:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--roots", type=int, default=400)
    parser.add_argument("--main-turns", type=int, default=20)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
