"""A scripted policy answers tool-free calls with a sequence (``tool_free_replies``), then ``tool_free_reply``:
what a text-action agent (mini-swe-agent's text mode: THOUGHT and one bash block per reply) needs to be driven.
Calls with tools keep their own cursor."""

from __future__ import annotations

import openai

THOUGHT = "THOUGHT: look first.\n\n```bash\nls\n```"
SCRIPT = {
    "type": "scripted",
    "replies": [{"content": "with tools"}],
    "tool_free_replies": [{"content": THOUGHT}, {"content": "THOUGHT: done.\n\n```bash\necho COMPLETE\n```"}],
    "tool_free_reply": "fallback",
}
TOOLS = [{"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}}]


def test_tool_free_calls_get_their_sequence_then_the_fallback(gateway):
    session = gateway.session(SCRIPT)
    client = openai.OpenAI(base_url=session["base_urls"]["openai"], api_key=session["api_key"])
    messages = [
        {"role": "system", "content": "Reply with THOUGHT and one bash block."},
        {"role": "user", "content": "Go"},
    ]
    seen = []
    for _ in range(3):
        reply = client.chat.completions.create(model="tiny", messages=messages).choices[0].message.content
        seen.append(reply)
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "output: ok"}]
    assert seen == [THOUGHT, SCRIPT["tool_free_replies"][1]["content"], "fallback"]
    with_tools = client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS).choices[0]
    assert with_tools.message.content == "with tools"  # the tool cursor did not move for tool-free calls
