"""The replay workflow: one recorded step recomputed; per artifact identical or what differs.

pyflyte run evosteer_flyte/workflows/replay.py replay --store_root runs --run_id RUN --step 2
"""

from flytekit import workflow

from evosteer_flyte.tasks.replay import ReplayResult, replay_step


@workflow
def replay(store_root: str, run_id: str, step: int, s3_endpoint: str = "") -> ReplayResult:
    return replay_step(store_root=store_root, s3_endpoint=s3_endpoint, run_id=run_id, step=step)
