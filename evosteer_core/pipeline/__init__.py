"""The pipeline layer the Flyte tasks and the replay call: stages as artifact-to-artifact functions, replay, report."""
