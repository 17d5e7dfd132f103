"""Flyte tasks: thin typed wrappers over evosteer_core (no algorithm lives here)."""
