"""The tools an OpenAI Responses request offers: function, custom (freeform, with an optional grammar) and
namespaced ones, flattened to canonical ``ToolSpec``s with the route each call must go back out by."""

from __future__ import annotations

from typing import Any, Literal

from polar.tokens.messages import ToolSpec
from polar.wire.openai_common import WireModel, index_path, validate
from polar.wire.openai_responses_output import ToolRoute
from polar.wire.tool_schema import check_schema


class ToolTypeWire(WireModel):
    type: str


class FunctionToolWire(WireModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class GrammarWire(WireModel):
    type: str
    syntax: str | None = None
    definition: str | None = None


class CustomToolWire(WireModel):
    name: str
    description: str | None = None
    format: GrammarWire | None = None


class NamespaceToolWire(WireModel):
    name: str
    description: str | None = None
    tools: list[Any]


def custom_tool_parameters(grammar: GrammarWire | None) -> dict[str, Any]:
    """The JSON schema offered for a freeform tool: one string, ``input``, with its grammar if it has one."""
    doc = "The tool's input, as free-form text."
    if grammar is not None and grammar.type == "grammar" and grammar.definition:
        syntax = f"{grammar.syntax} " if grammar.syntax else ""
        doc = f"The tool's input: text that follows this {syntax}grammar.\n{grammar.definition}"
    return {
        "type": "object",
        "properties": {"input": {"type": "string", "description": doc}},
        "required": ["input"],
    }


class OfferedTools:
    """Offered tools in declaration order, first declaration of a name wins, with their routes."""

    def __init__(self) -> None:
        self.specs: list[ToolSpec] = []
        self.routes: dict[str, ToolRoute] = {}

    def add_all(self, tools: list[Any], path: str) -> None:
        for index, raw in enumerate(tools):
            self.add(raw, index_path(path, index), namespace=None)

    def add(self, raw: Any, path: str, *, namespace: NamespaceToolWire | None) -> None:
        kind = validate(ToolTypeWire, raw, prefix=path).type
        if kind == "function":
            tool = validate(FunctionToolWire, raw, prefix=path)
            if tool.parameters is not None:
                check_schema(tool.parameters, f"{path}.parameters")
            self._offer(tool.name, tool.description, tool.parameters or {}, "function", namespace)
        elif kind == "custom":
            custom = validate(CustomToolWire, raw, prefix=path)
            self._offer(custom.name, custom.description, custom_tool_parameters(custom.format), "custom", namespace)
        elif kind == "namespace" and namespace is None:
            group = validate(NamespaceToolWire, raw, prefix=path)
            for index, inner in enumerate(group.tools):
                self.add(inner, f"{path}.tools[{index}]", namespace=group)
        # Anything else is a hosted or built-in tool: skipped (see the module docstring).

    def _offer(
        self,
        name: str,
        description: str | None,
        parameters: dict[str, Any],
        kind: Literal["function", "custom"],
        namespace: NamespaceToolWire | None,
    ) -> None:
        offered = flat_name(name, namespace.name if namespace is not None else None)
        if offered in self.routes:
            return  # a name declared twice (tools and additional_tools): the model can only mean one
        text = description or ""
        if namespace is not None and namespace.description:
            text = f"{text}\n\n(In {namespace.name}: {namespace.description})".strip()
        self.specs.append(ToolSpec(offered, text, parameters))
        self.routes[offered] = ToolRoute(kind, name, namespace.name if namespace is not None else None)


def flat_name(name: str, namespace: str | None) -> str:
    return f"{namespace}.{name}" if namespace else name
