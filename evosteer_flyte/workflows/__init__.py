"""Flyte workflows: train, evaluate, replay, and launch (their launch plans)."""
