"""simkit report (being written)."""
