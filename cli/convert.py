"""simkit convert (being written)."""
