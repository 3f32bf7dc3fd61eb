"""The `simkit` command line (installed as ``simkit.cli``). Each command lives in its own module."""
