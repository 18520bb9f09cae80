"""Tokens: tokenizer, chat template, prompt building (canonical and append mode), output parsers."""
