"""Capture persistence: one call as one row, and the writer that commits rows in groups (SQL per store)."""
