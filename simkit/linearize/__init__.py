"""simkit.linearize."""
