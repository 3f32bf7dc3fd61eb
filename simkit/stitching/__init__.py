"""simkit.stitching."""
