"""One small declarative module per agent harness (Codex, Claude Code, Gemini CLI, ...), behind a registry."""
