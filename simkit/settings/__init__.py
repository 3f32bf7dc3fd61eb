"""Every runner's settings class, torch-free (the command line builds its options from them without
importing torch): :class:`~simkit.settings.compare.CompareSettings` ... Each field is declared once with
``simkit.options.option`` (default, constraint, help, flag)."""
