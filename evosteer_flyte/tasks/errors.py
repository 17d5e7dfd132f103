"""How core errors map onto Flyte's error kinds.

``evosteer_core`` imports no flytekit, so a recoverable failure there is a plain exception;
here it becomes ``FlyteRecoverableException``, which Flyte retries (up to ``RETRIES``) and,
being a failure, never caches as a result. Flyte treats every other exception as a user
error and fails the task at once, which is what a bad config, bad data or a missing artifact
should do: a retry would meet them again.
"""

from collections.abc import Iterator
from contextlib import contextmanager

from flytekit.exceptions.user import FlyteRecoverableException

from evosteer_core.executors.breaker import ExecutorOutageError
from evosteer_core.infra.artifacts import StoreError


def infrastructure_failure(exc: BaseException) -> BaseException | None:
    """The infrastructure failure in ``exc``'s cause chain, if any: an executor outage or a
    transient store failure (``StoreError.transient``: timeouts, lost connections, S3
    throttling or 5xx). A store the config gets wrong (no bucket, bad credentials, read-only
    path) is not one."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, ExecutorOutageError) or (isinstance(cur, StoreError) and cur.transient):
            return cur
        cur = cur.__cause__ or cur.__context__
    return None


@contextmanager
def infrastructure_is_recoverable() -> Iterator[None]:
    """Re-raise an infrastructure failure (:func:`infrastructure_failure`) as a recoverable
    Flyte error whose cause it is; every other error passes unchanged. Usable as a decorator
    under ``@task``."""
    try:
        yield
    except FlyteRecoverableException:
        raise
    except Exception as exc:
        failure = infrastructure_failure(exc)
        if failure is None:
            raise
        raise FlyteRecoverableException(str(failure)) from failure
