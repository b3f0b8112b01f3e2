"""The run's default schedule, in a module that imports nothing: the CLI's parser reads it,
and `python -m ladder --help` (or a bad flag) must answer without loading torch."""
DEFAULT_PROMPT, DEFAULT_STEPS = 6, 12
