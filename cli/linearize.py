"""simkit linearize (being written)."""
