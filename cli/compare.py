"""simkit compare (being written)."""
