"""A bounded least-recently-used memo of a pure function's results.

Used where one process asks for the same pure result many times: the tokenizer's prompt ids
and the grammar tries (a step's stages encode the same prompts), and the metrics of a step's
content-addressed artifacts (every Deck of a run reads every step so far).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class BoundedMemo(Generic[K, V]):
    """The results of a pure function by key, at most ``size`` entries (least recently used
    dropped first)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[K, V] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: K, compute: Callable[[], V]) -> V:
        """The value kept for ``key``, or ``compute()`` (kept unless it raises)."""
        try:
            self._items.move_to_end(key)
            return self._items[key]
        except KeyError:
            value = compute()
            self._items[key] = value
            if len(self._items) > self.size:
                self._items.popitem(last=False)
            return value
