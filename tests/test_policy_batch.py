"""Micro-batches of decisions that share a prompt prefix (policy/batch.py)."""

from __future__ import annotations

import random

import pytest

from evosteer_core.policy.batch import PASS_TOKENS, length_batches, shared_prefix_groups


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


def _partitions(items: list[int]):
    """Every set partition of ``items`` (brute force, for a handful of rows)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in _partitions(rest):
        yield [[first], *part]
        for k in range(len(part)):
            yield [*part[:k], [first, *part[k]], *part[k + 1 :]]


@pytest.mark.parametrize("seed", range(12))
def test_length_batches_cost_the_least_of_every_partition(seed: int) -> None:
    """The split's padded tokens plus PASS_TOKENS a batch equal the minimum over every set
    partition of the rows (not only runs of the sorted order), found by enumeration."""
    rng = random.Random(seed)
    lengths = [rng.randint(1, 300) for _ in range(rng.randint(1, 7))]
    pass_tokens = rng.choice([0, 16, PASS_TOKENS, 1000])

    def cost(batches: list[list[int]]) -> int:
        return sum(len(b) * max(lengths[i] for i in b) + pass_tokens for b in batches)

    got = length_batches(lengths, pass_tokens)
    assert sorted(i for b in got for i in b) == list(range(len(lengths)))
    assert cost(got) == min(cost(p) for p in _partitions(list(range(len(lengths)))))
    assert got == length_batches(lengths, pass_tokens)


def test_length_batches_split_only_when_the_pads_outweigh_a_pass() -> None:
    assert length_batches([]) == []
    assert length_batches([5, 5, 5], 10) == [[0, 1, 2]]
    assert length_batches([100, 10, 100, 10], 10) == [[0, 2], [1, 3]]  # 2·100 + 2·10 + 20
    assert length_batches([100, 10, 100, 10], 400) == [[0, 2, 1, 3]]  # one pass: 400 + 400


def test_a_pass_price_merges_groups_until_one_pass_saves_more_than_it_costs() -> None:
    """Two tasks' heads (20 tokens each, 3 decisions each) under a 4-token system text: with
    no price each task is a group (Σ shared·(size − 1) = 2·20·2 = 80 saved, four passes);
    one group of all six saves 4·5 = 20 in two passes, so it wins once 80 − 4p < 20 − 2p,
    i.e. a price p above 30 tokens a pass."""
    rng = random.Random(0)
    system = [1, 2, 3, 4]
    heads = [system + [rng.randint(10, 99) for _ in range(16)] for _ in range(2)]
    seqs = [h + [rng.randint(100, 200) for _ in range(5)] for h in heads for _ in range(3)]
    two = shared_prefix_groups(seqs, 64)
    assert sorted(len(m) for m, _ in two) == [3, 3] and {s for _, s in two} == {20}
    assert shared_prefix_groups(seqs, 64, 29) == two
    one = shared_prefix_groups(seqs, 64, 31)
    assert [sorted(m) for m, _ in one] == [list(range(6))] and one[0][1] == 4
