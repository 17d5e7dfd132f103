"""Agent tools: the Python sandbox and search retrievers (SPEC §1.3)."""
