"""Executor backends behind one protocol (see ``executors.base``)."""
