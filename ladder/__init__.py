"""The parity harness: capture, compare, locate, tolerance tables, fixtures, CLI."""
