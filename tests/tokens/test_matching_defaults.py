"""An echoed call that only adds arguments at their declared schema defaults is the same call (Claude Code's Edit)."""

from __future__ import annotations

from polar.tokens.matching import extension_start
from polar.tokens.messages import Message, Role, ToolCall, ToolSpec, tool_result, user

EDIT = ToolSpec(
    "Edit",
    "Edit a file",
    {
        "type": "object",
        "properties": {
            "file_path": {"type": "string"},
            "old_string": {"type": "string"},
            "new_string": {"type": "string"},
            "replace_all": {"type": "boolean", "default": False},
        },
        "required": ["file_path", "old_string", "new_string"],
    },
)
SAMPLED = '{"file_path": "a.py", "old_string": "a - b", "new_string": "a + b"}'


def _request(echoed_arguments: str) -> list[Message]:
    echo = Message(Role.ASSISTANT, "", None, (ToolCall("Edit", echoed_arguments, "toolu_1"),))
    return [user("fix it"), echo, tool_result("ok", "toolu_1")]


def _start(echoed_arguments: str) -> int | None:
    reply = Message(Role.ASSISTANT, "", None, (ToolCall("Edit", SAMPLED, "call_0"),))
    return extension_start(_request(echoed_arguments), [EDIT], [user("fix it")], [EDIT], reply)


def test_an_added_argument_at_its_declared_default_is_the_same_call() -> None:
    assert _start(SAMPLED) == 2
    assert _start('{"file_path": "a.py", "old_string": "a - b", "new_string": "a + b", "replace_all": false}') == 2


def test_an_added_argument_off_its_default_or_undeclared_is_a_different_call() -> None:
    assert _start('{"file_path": "a.py", "old_string": "a - b", "new_string": "a + b", "replace_all": true}') is None
    assert _start('{"file_path": "a.py", "old_string": "a - b", "new_string": "a + b", "mode": "x"}') is None
    assert _start('{"file_path": "a.py", "old_string": "a - b", "new_string": "a * b"}') is None
