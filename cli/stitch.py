"""simkit stitch (being written)."""
