"""Session state in this process: authenticated keys, the session's known calls (history) and their ids."""
