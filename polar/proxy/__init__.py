"""The gateway: one FastAPI proxy speaking OpenAI Chat, OpenAI Responses, Anthropic Messages and Gemini.

``protocols/`` translates each wire family to and from the canonical request/completion in
``canonical.py``; the rest (sessions, prompt building, generation, capture) is protocol-agnostic.
"""
