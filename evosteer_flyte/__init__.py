"""The Flyte side of EvoSteer: tasks, workflows and the ``evosteer`` command."""
