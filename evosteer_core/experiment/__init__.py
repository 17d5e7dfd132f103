"""Comparison experiments: rows × seeds of runs, each trained (or not) and evaluated alike, and
the table that compares them pair by pair (docs/experiments.md)."""
