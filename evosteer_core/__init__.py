"""EvoSteer core library: environment, policy, objectives, skills. Imports no flytekit."""

__version__ = "0.1.0"
