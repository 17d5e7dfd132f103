"""Canonical action JSON (docs/method.md §1.2): round trips, exact text, and clear rejections."""

from __future__ import annotations

import json

import pytest

from evosteer_core.episode.actions import KINDS, Action, ActionFormatError, canonical_json

EXAMPLES = {
    "ADD_AGENT": [
        (
            Action("ADD_AGENT", node_id="n3", role_id="verifier"),
            '{"kind":"ADD_AGENT","node_id":"n3","role_id":"verifier"}',
        ),
        (
            Action("ADD_AGENT", node_id="n3", role_id="verifier", skill_id="evosteer-ab12"),
            '{"kind":"ADD_AGENT","node_id":"n3","role_id":"verifier","skill_id":"evosteer-ab12"}',
        ),
    ],
    "ADD_EDGE": [
        (
            Action("ADD_EDGE", source_id="n0", target_id="n1", protocol="revise"),
            '{"kind":"ADD_EDGE","protocol":"revise","source_id":"n0","target_id":"n1"}',
        ),
        (
            Action("ADD_EDGE", source_id="n2", target_id="n0", protocol="feedback"),
            '{"kind":"ADD_EDGE","protocol":"feedback","source_id":"n2","target_id":"n0"}',
        ),
    ],
    "BIND_SKILL": [
        (
            Action("BIND_SKILL", node_id="n1", skill_id="evosteer-ünï"),
            '{"kind":"BIND_SKILL","node_id":"n1","skill_id":"evosteer-ünï"}',
        )
    ],
    "SET_OUTPUT": [(Action("SET_OUTPUT", node_id="n0"), '{"kind":"SET_OUTPUT","node_id":"n0"}')],
    "RERUN_AGENT": [(Action("RERUN_AGENT", node_id="n0"), '{"kind":"RERUN_AGENT","node_id":"n0"}')],
    "DROP_AGENT": [(Action("DROP_AGENT", node_id="n2"), '{"kind":"DROP_AGENT","node_id":"n2"}')],
    "STOP": [(Action("STOP"), '{"kind":"STOP"}')],
}


def test_examples_cover_every_kind() -> None:
    assert set(EXAMPLES) == set(KINDS)


@pytest.mark.parametrize(
    ("action", "text"), [pair for pairs in EXAMPLES.values() for pair in pairs]
)
def test_canonical_text_and_round_trip(action: Action, text: str) -> None:
    assert action.to_json() == text
    assert Action.from_json(text) == action
    assert Action.from_json(action.to_json()).to_json() == text


@pytest.mark.parametrize(("action", "_"), [pair for pairs in EXAMPLES.values() for pair in pairs])
def test_canonical_form_is_sorted_compact_and_unescaped(action: Action, _: str) -> None:
    text = action.to_json()
    data = json.loads(text)
    assert list(data) == sorted(data)
    assert text == json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert " " not in text and "\\u" not in text


def test_non_ascii_is_kept_verbatim() -> None:
    text = Action("BIND_SKILL", node_id="n1", skill_id="évo-技能").to_json()
    assert "évo-技能" in text
    assert canonical_json({"b": "ü", "a": 1}) == '{"a":1,"b":"ü"}'


def test_non_canonical_input_parses_to_the_same_action() -> None:
    loose = '{ "target_id": "n1", "kind": "ADD_EDGE", "source_id": "n0", "protocol": "revise" }'
    action = Action.from_json(loose)
    assert action.to_json() == EXAMPLES["ADD_EDGE"][0][1]


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ('{"kind":"ADD_AGENT","node_id":"n1"}', "role_id"),
        ('{"kind":"ADD_AGENT","role_id":"solver"}', "node_id"),
        ('{"kind":"ADD_EDGE","source_id":"n0","target_id":"n1"}', "protocol"),
        ('{"kind":"ADD_EDGE","protocol":"revise","target_id":"n1"}', "source_id"),
        ('{"kind":"ADD_EDGE","protocol":"revise","source_id":"n0"}', "target_id"),
        ('{"kind":"ADD_EDGE","protocol":"shout","source_id":"n0","target_id":"n1"}', "shout"),
        ('{"kind":"BIND_SKILL","node_id":"n1"}', "skill_id"),
        ('{"kind":"SET_OUTPUT"}', "node_id"),
        ('{"kind":"SET_OUTPUT","node_id":""}', "node_id"),
        ('{"kind":"RERUN_AGENT","node_id":7}', "node_id"),
        ('{"kind":"DROP_AGENT","node_id":"n1","skill_id":"s"}', "skill_id"),
        ('{"kind":"STOP","node_id":"n0"}', "node_id"),
        ('{"kind":"SET_OUTPUT","node_id":"n0","colour":"red"}', "colour"),
        ('{"kind":"JUMP"}', "JUMP"),
        ('{"node_id":"n0"}', "kind"),
        ('["STOP"]', "kind"),
        ('{"kind":"STOP"', "not JSON"),
        ("STOP", "not JSON"),
    ],
)
def test_malformed_actions_are_rejected_naming_the_field(text: str, names: str) -> None:
    with pytest.raises(ActionFormatError, match=names):
        Action.from_json(text)


def test_rejected_direct_construction() -> None:
    with pytest.raises(ActionFormatError, match="protocol"):
        Action("SET_OUTPUT", node_id="n0", protocol="revise")
    with pytest.raises(ActionFormatError, match="kind"):
        Action("stop")


def test_actions_are_hashable_and_sort_deterministically() -> None:
    actions = [a for pairs in EXAMPLES.values() for a, _ in pairs]
    assert len(set(actions)) == len(actions)
    assert sorted(actions, key=Action.to_json) == sorted(reversed(actions), key=Action.to_json)
