"""simkit.surgery."""
