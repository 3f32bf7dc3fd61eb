"""simkit layers (being written)."""
