"""simkit graft (being written)."""
