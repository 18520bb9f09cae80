import asyncio, gc, tracemalloc
from polar.backends.local import LocalBackend
from tests.proxy.asgi_gateway import asgi_gateway, open_session
from tests.proxy.gateway_server import settings_for

SCRIPT = {"type": "scripted", "replies": [{"content": "reply 0"}]}
N = 300

async def _run(settings, engine):
    async with asgi_gateway(settings, LocalBackend(engine)) as (gw, client):
        msgs = [{"role": "system", "content": "You are a coding agent. " * 40}] + [
            {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} " * 20} for i in range(9)]
        async def one():
            s = await open_session(client, policy=SCRIPT)
            r = await client.post("/v1/chat/completions", json={"model": "tiny", "messages": msgs, "max_tokens": 4}, headers={"Authorization": f"Bearer {s['api_key']}"})
            assert r.status_code == 200, r.text
        await one()
        gc.collect()
        tracemalloc.start(8)
        a = tracemalloc.take_snapshot()
        for _ in range(N // 50):
            await asyncio.gather(*(one() for _ in range(50)))
        gc.collect()
        b = tracemalloc.take_snapshot()
        stats = b.compare_to(a, "lineno")
        total = sum(s.size_diff for s in stats)
        print(f"\nTOTAL per session {total / N / 1024:.1f} KiB")
        for s in stats[:25]:
            print(f"{s.size_diff / N / 1024:7.2f} KiB {s.count_diff / N:6.1f} obj  {s.traceback[0]}")
        stats = b.compare_to(a, "traceback")
        for s in stats[:6]:
            print(f"---- {s.size_diff / N / 1024:7.2f} KiB")
            for fr in s.traceback.format()[-16:]:
                print("   ", fr)

def test_probe(tmp_path, cache_dir, engine):
    asyncio.run(_run(settings_for(tmp_path, cache_dir), engine))
