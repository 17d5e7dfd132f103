"""Evaluation: score tables and tilt diagnostics."""
