"""Experiments: research scripts on the SIMULATED suite and the analysis code only they, the tests
and the developer scripts use (not installed with the package; see experiments/README.md)."""
