"""How core errors map onto Flyte's error kinds.

``evosteer_core`` imports no flytekit, so a recoverable failure there is a plain exception;
here it becomes ``FlyteRecoverableException``, which Flyte retries (up to ``RETRIES``) and,
being a failure, never caches as a result.
"""

from collections.abc import Iterator
from contextlib import contextmanager

from flytekit.exceptions.user import FlyteRecoverableException

from evosteer_core.executors.breaker import ExecutorOutageError


@contextmanager
def executor_outage_is_recoverable() -> Iterator[None]:
    """Re-raise an :class:`ExecutorOutageError` as a recoverable Flyte error (its cause)."""
    try:
        yield
    except ExecutorOutageError as exc:
        raise FlyteRecoverableException(str(exc)) from exc
