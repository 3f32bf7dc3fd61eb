"""simkit.models."""
