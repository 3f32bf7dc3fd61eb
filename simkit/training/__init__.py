"""simkit.training."""
