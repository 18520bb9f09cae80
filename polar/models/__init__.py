"""The local model: tiny seeded Qwen3-style fixtures and an in-process generation engine."""
