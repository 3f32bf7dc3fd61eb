"""simkit capture (being written)."""
