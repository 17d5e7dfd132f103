"""Flyte workflows: train, evaluate, replay."""
