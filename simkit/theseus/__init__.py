"""simkit.theseus."""
