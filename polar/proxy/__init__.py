"""The gateway: one server speaking OpenAI Chat, OpenAI Responses, Anthropic Messages and Gemini.

Each wire family is translated to and from the canonical request and completion by its codec in ``polar.wire``;
what is here is protocol-agnostic, in four parts:

- ``http/``: the ASGI app, its routes (model calls, sessions, admin, health) and streamed responses;
- ``call/``: one call's pipeline: intake (key, body, cost bound), planning, generation, recording;
- ``session/``: sessions, their call history and what a call's history witnesses;
- ``capture/``: capture rows and the writer that commits them.

``gateway.py`` wires the parts once; ``server.py`` runs it under uvicorn (``polar gateway``).
"""
