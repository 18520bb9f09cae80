"""The screening process for over-size bodies (``polar.proxy.call.screen``): a real child process, the gateway's
own codecs. Its refusal is the very error the gateway's own decode raises; a body that passes, or one the child
cannot answer for (killed, stuck), is left to the gateway, and the next body gets a new child."""

from __future__ import annotations

import asyncio
import json

import pytest

from polar.errors import ContextLengthExceeded, InvalidRequest, PolarError
from polar.proxy.call.cost import CostBound
from polar.proxy.call.screen import BodyScreen, ScreenRules, screen
from polar.wire.json_guard import JsonLimits
from tests.proxy.big_bodies import long_description_body, many_messages_body, many_tools_body

BOUND = CostBound(max_token_chars=16, context_length=2048, message_tokens=2)
TINY = ScreenRules("anthropic_messages", JsonLimits(), BOUND)
OPENAI = ScreenRules("openai_chat", JsonLimits(), BOUND)


def in_process(raw: bytes, rules: ScreenRules) -> PolarError | None:
    try:
        screen(raw, rules)
    except PolarError as exc:
        return exc
    return None


def same_error(a: PolarError | None, b: PolarError | None) -> None:
    assert a is not None and b is not None
    assert type(a) is type(b)
    assert (a.args, a.message, a.field, a.status_code) == (b.args, b.message, b.field, b.status_code)


@pytest.mark.parametrize(
    ("raw", "rules", "kind"),
    [
        (many_tools_body(20_000), TINY, ContextLengthExceeded),
        (long_description_body(200_000), OPENAI, ContextLengthExceeded),
        (many_messages_body(20_000), OPENAI, ContextLengthExceeded),
        (b'{"model": "tiny", "messages": [' + b"1," * 50_000 + b"1]}", OPENAI, InvalidRequest),
        (b'{"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}', TINY, InvalidRequest),
    ],
    ids=["many-tools", "long-description", "many-messages", "bad-message", "truncated-json"],
)
def test_the_childs_refusal_is_the_gateways_own(raw, rules, kind):
    expected = in_process(raw, rules)
    assert isinstance(expected, kind)

    async def scenario() -> PolarError | None:
        checker = BodyScreen()
        try:
            await checker.check(raw, rules)
        except PolarError as exc:
            return exc
        finally:
            await checker.aclose()
        return None

    got = asyncio.run(scenario())
    same_error(got, expected)
    if isinstance(expected, ContextLengthExceeded):
        assert isinstance(got, ContextLengthExceeded)
        assert (got.prompt_tokens, got.context_length) == (expected.prompt_tokens, expected.context_length)


def test_a_body_that_fits_passes_and_the_child_serves_many():
    text = "x" * 30_000  # over a 2048-token window's byte bound at 8 chars/token, yet 30k chars / 16 fits it
    fits = json.dumps({"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": text}]}).encode()
    rules = ScreenRules("anthropic_messages", JsonLimits(), BOUND)

    async def scenario() -> tuple[int, int, list[str]]:
        checker = BodyScreen()
        refused = []
        try:
            for raw in (fits, many_tools_body(5_000), fits):
                try:
                    await checker.check(raw, rules)
                except ContextLengthExceeded as exc:
                    refused.append(exc.message)
            pid = checker._child.pid if checker._child else 0
        finally:
            await checker.aclose()
        return checker.screened, pid, refused

    screened, pid, refused = asyncio.run(scenario())
    assert screened == 3 and pid > 0
    assert len(refused) == 1 and "at least" in refused[0]


def test_a_dead_child_is_replaced_and_a_stuck_one_leaves_the_body_to_the_gateway():
    async def scenario() -> tuple[int, int, int]:
        checker = BodyScreen(timeout_s=2.0)
        try:
            with pytest.raises(ContextLengthExceeded):
                await checker.check(many_tools_body(5_000), TINY)
            first = await checker._started()
            first.kill()
            await first.wait()
            with pytest.raises(ContextLengthExceeded):  # a dead child is replaced before the next body
                await checker.check(many_tools_body(5_000), TINY)
            stuck = await checker._started()
            stuck.send_signal(19)  # SIGSTOP: the child answers nothing
            await checker.check(many_tools_body(5_000), TINY)  # given up after the timeout
            with pytest.raises(ContextLengthExceeded):  # a new child for the next body
                await checker.check(many_tools_body(5_000), TINY)
            assert checker._child is not None and checker._child.pid not in (first.pid, stuck.pid)
        finally:
            await checker.aclose()
        return checker.screened, checker.failed, stuck.returncode or 0

    screened, failed, stuck_code = asyncio.run(scenario())
    assert (screened, failed) == (3, 1)
    assert stuck_code != 0  # killed, not left behind
