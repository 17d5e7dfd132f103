"""Agent tools: the Python sandbox and search retrievers (docs/method.md §1.3)."""
