"""simkit.metrics."""
