"""Micro-batches of decisions that share a prompt prefix (policy/batch.py)."""

from __future__ import annotations

import random

import pytest

from evosteer_core.policy.batch import shared_prefix_groups


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _planted(seed: int) -> tuple[list[list[int]], list[int], int]:
    """Sequences of 5 tasks: a 4-token system text, a 30-token task head, a 3–12 token tail."""
    rng = random.Random(seed)
    system = [1, 2, 3, 4]
    seqs, task_of = [], []
    for task in range(5):
        head = system + [rng.randrange(10, 60) for _ in range(30)]
        for _ in range(rng.randrange(2, 9)):
            seqs.append(head + [rng.randrange(10, 60) for _ in range(rng.randrange(3, 13))])
            task_of.append(task)
    order = list(range(len(seqs)))
    rng.shuffle(order)
    return [seqs[i] for i in order], [task_of[i] for i in order], len(system) + 30


@pytest.mark.parametrize("seed", range(20))
def test_groups_partition_share_a_true_prefix_and_recover_the_task_heads(seed: int) -> None:
    seqs, task_of, head = _planted(seed)
    groups = shared_prefix_groups(seqs, max_group=64)
    members = sorted(i for group, _ in groups for i in group)
    assert members == list(range(len(seqs)))
    for group, shared in groups:
        assert all(shared < len(seqs[i]) for i in group)
        assert all(_common(seqs[group[0]], seqs[i]) >= shared for i in group)
        assert shared == 0 or len(group) > 1
        # the best cut keeps each task together and shares at least its head
        assert len({task_of[i] for i in group}) == 1
        assert shared >= head
    assert len(groups) == len(set(task_of))


def test_group_size_is_capped_and_the_result_is_deterministic() -> None:
    seqs, _, head = _planted(3)
    groups = shared_prefix_groups(seqs, max_group=2)
    assert all(len(g) <= 2 for g, _ in groups)
    assert all(shared >= head for g, shared in groups if len(g) == 2)
    assert groups == shared_prefix_groups(seqs, max_group=2)
    assert [len(g) for g, _ in shared_prefix_groups(seqs, max_group=1)] == [1] * len(seqs)
    assert all(shared == 0 for _, shared in shared_prefix_groups(seqs, max_group=1))


def test_identical_sequences_share_all_but_their_last_token_and_bad_input() -> None:
    assert shared_prefix_groups([[5, 6, 7]] * 3, max_group=8) == [([0, 1, 2], 2)]
    assert shared_prefix_groups([], max_group=8) == []
    with pytest.raises(ValueError, match="max_group"):
        shared_prefix_groups([[1]], max_group=0)
