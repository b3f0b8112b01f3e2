"""The port's refusal of a step, in a module of its own so every part of port/ can raise it
without importing the model (no import circle: tests/project/test_port_imports.py)."""
from __future__ import annotations


class StepError(ValueError):
    """A step the model refuses (names the value and the limit); the state is untouched."""
