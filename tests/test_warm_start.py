"""The warm start of the reference (policy.init, docs/warm_start.md): it never sees held-out
records, it is deterministic, the Flyte task is cached, the run's sessions load its weights
(θ = warm base + a zero LoRA), the config hashes its spec and not its ref, and what the policy
sees of a task never names its record or split."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from machine_pins import machine_key, pinned
from pipeline_support import isolate_flyte_cache
from safetensors.torch import load as load_safetensors

from evosteer_core.benchmarks.rewards import evaluate
from evosteer_core.episode.records import FAMILIES
from evosteer_core.episode.roles import default_catalogue
from evosteer_core.episode.runtime import Episode
from evosteer_core.infra.artifacts import LocalStore, canonical_json, store_id
from evosteer_core.infra.config import load_config
from evosteer_core.infra.configio import ConfigError
from evosteer_core.infra.runs import NOT_COMPUTED, OPERATIONAL_KEYS, config_hash
from evosteer_core.policy.render import RENDERERS, public_state
from evosteer_core.sim import SimExecutor, make_sim_suite
from evosteer_core.sim import suite as sim_suite
from evosteer_core.training import warm_start as ws
from evosteer_core.training.session import init_state, open_session

INIT = {"kind": "sft", "tasks_per_family": 1, "candidates": 3, "replays": 1, "epochs": 1}
"""A warm start small enough for a test (6 tasks, a few dozen decisions)."""

WEIGHTS_BEFORE_PARADIGMS = {
    "AuthenticAMD AVX2 torch 2.13.0+cpu": (
        "691b0058fc2f412ce3f29a6e083c9fdbbe6f67582631bd2e68dbccb593a18a5b"
    ),
    "AuthenticAMD AVX512 torch 2.13.0+cpu": (
        "1b200668a3148e6826d53d9ca62066f576fd43ca3468abf8cd7774c988805f5a"
    ),
    "GenuineIntel AVX512 torch 2.13.0+cpu": (
        "ba238644d58d2cfe3c6252852015c8843646deea15c369e854048bd665c7128b"
    ),
}
"""sha256 of the weights of ``INIT`` on ``SMALL`` with random candidates only, per machine
(``tests/machine_pins.py``): adding paradigm candidates (after 42e9259) left the random
search's bytes unchanged, and this pins them since. Re-pinned when the last layer began to run
at the read positions only (``CODE_VERSION`` 8) and when scoring began to price its passes
(``CODE_VERSION`` 9), both float rounding (docs/performance.md); a machine's entry is what
:data:`RECORD` prints there."""
RECORD = ".venv/bin/python tests/test_warm_start.py"

SMALL = {
    "sim.n_train_per_family": 3,
    "sim.n_heldout_per_family": 2,
    "budget.max_actions": 6,
    "skills.enabled": False,
}


def _cfg(tmp_path, **extra):
    return load_config(
        None, {**SMALL, "store.root": str(tmp_path / "runs"), "policy.init": INIT, **extra}
    )


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.mark.parametrize("paradigms", [(), ("template", "plan_execute")])
def test_the_warm_start_never_loads_or_runs_a_held_out_record(tmp_path, monkeypatch, paradigms):
    """Sentinel: building any split but ``train`` fails, and every episode the warm start
    opens is a training record's (the paradigms' episodes too); its demonstrations name
    training records only."""
    made, opened = [], []
    original = sim_suite.make_sim_suite

    def train_only(n, seed, split):
        made.append(split)
        assert split == "train", f"the warm start built the {split!r} split"
        return original(n, seed, split)

    init = Episode.__init__

    def watched(self, task, *args, **kwargs):
        opened.append(task.record_id)
        init(self, task, *args, **kwargs)

    monkeypatch.setattr(sim_suite, "make_sim_suite", train_only)
    monkeypatch.setattr(Episode, "__init__", watched)
    cfg = _cfg(tmp_path, **{"policy.init": {**INIT, "paradigms": list(paradigms)}})
    weights, summary = ws.warm_start_weights(cfg)
    train_ids = {r.record_id for r in original(3, 0, "train")}
    assert made == ["train"] and opened and set(opened) <= train_ids
    assert all("-train-" in r for r in opened)
    assert summary["tasks"] == len(FAMILIES) and summary["decisions"] > 0
    if not paradigms:  # the bytes of the search before paradigm candidates existed (42e9259)
        expected = pinned(WEIGHTS_BEFORE_PARADIGMS, "weights of 42e9259", RECORD)
        assert hashlib.sha256(weights).hexdigest() == expected


def test_the_held_out_split_does_not_change_the_weights(tmp_path):
    """Black box: other held-out records (count, seed of the split) give the same bytes."""
    a, _ = ws.warm_start_weights(_cfg(tmp_path))
    other = _cfg(tmp_path, **{"sim.n_heldout_per_family": 5})
    b, _ = ws.warm_start_weights(other)
    assert hashlib.sha256(a).hexdigest() == hashlib.sha256(b).hexdigest()
    assert ws.warm_start_key(other) == ws.warm_start_key(_cfg(tmp_path))  # one cached fit


def test_the_same_spec_gives_the_same_sha256_and_another_seed_other_weights(tmp_path):
    cfg = _cfg(tmp_path)
    store = LocalStore(tmp_path / "runs")
    first, _ = ws.store_warm_start(cfg, store)
    again, _ = ws.store_warm_start(cfg, store)
    assert first == again
    other = _cfg(tmp_path, **{"policy.init": {**INIT, "seed": 1}})
    assert ws.store_warm_start(other, store)[0].sha256 != first.sha256


def test_a_session_loads_the_warm_weights_as_rho_and_theta_starts_equal(tmp_path):
    cfg = ws.stage_warm_start(_cfg(tmp_path))
    assert cfg.policy.init.ref is not None
    session = open_session(cfg, init_state(cfg))
    base = dict(session.policy.policy.model.get_base_model().named_parameters())
    stored = load_safetensors(LocalStore(tmp_path / "runs").get_bytes(cfg.policy.init.ref))
    fresh = load_config(None, {**SMALL, "store.root": str(tmp_path / "runs")})
    plain_model = open_session(fresh, init_state(fresh)).policy.policy.model
    plain = dict(plain_model.get_base_model().named_parameters())
    for name in ("model.embed_tokens.weight", "model.layers.1.mlp.down_proj.weight"):
        assert torch.equal(base[name], stored[name])
        assert not torch.equal(plain[name], stored[name])  # the fit moved it
    q = "model.layers.0.self_attn.q_proj"
    assert torch.equal(base[f"{q}.base_layer.weight"], stored[f"{q}.weight"])
    record = make_sim_suite(1, 0, "train")[0]
    ep = Episode(record, default_catalogue(), cfg.budget, SimExecutor(), evaluate)
    prompt = session.policy.policy.render(public_state(ep, 0.5, None))
    legal = [a.to_json() for a in ep.legal_actions()]
    theta = session.policy.score([prompt], legal[:1], [legal], use_adapter=True)
    rho = session.policy.score([prompt], legal[:1], [legal], use_adapter=False)
    assert torch.equal(theta, rho)  # LoRA B = 0: θ = warm base + zero adapter


def test_the_warm_start_task_is_cached(tmp_path, monkeypatch):
    from evosteer_flyte.tasks import warm_start as task_module

    isolate_flyte_cache(monkeypatch, tmp_path / "home")
    calls = []
    original = task_module.store_warm_start

    def counted(cfg, store):
        calls.append(1)
        return original(cfg, store)

    monkeypatch.setattr(task_module, "store_warm_start", counted)
    cfg = _cfg(tmp_path)
    sid = store_id(LocalStore(tmp_path / "runs"))
    key = ws.warm_start_key(cfg)
    first = task_module.warm_start(key=key, store=sid, config_yaml=cfg.to_yaml())
    second = task_module.warm_start(key=key, store=sid, config_yaml=cfg.to_yaml())
    assert first == second and len(calls) == 1
    trained_differently = _cfg(tmp_path, **{"train.actor.lr": 0.5})
    assert ws.warm_start_key(trained_differently) == key  # the fit does not depend on it


def test_the_hash_holds_the_spec_not_the_ref_and_none_keeps_old_run_ids(tmp_path):
    cfg = _cfg(tmp_path)
    assert config_hash(cfg) != config_hash(_cfg(tmp_path, **{"policy.init": {**INIT, "lr": 0.1}}))
    ref = LocalStore(tmp_path / "runs").put_bytes(b"weights")
    assert config_hash(ws.with_warm_start(cfg, ref)) == config_hash(cfg)
    # without the key a config hashes as configs did before the key existed
    plain = load_config(None, {"store.root": str(tmp_path)})
    data = plain.public_dict()
    assert data["policy"].pop("init") is None
    skip = (*OPERATIONAL_KEYS, "ablation")  # ablation: all defaults
    data = {k: v for k, v in data.items() if k not in skip}
    for dotted in NOT_COMPUTED:
        section, key = dotted.split(".")
        data[section].pop(key)
    assert data["executor"].pop("serve") is None  # no managed server: hashed as before it
    assert data["budget"].pop("max_output_tokens") is None  # no output cap: likewise
    assert data["train"].pop("update_micro_batch") is None  # the default micro-batch: likewise
    assert config_hash(plain) == hashlib.sha256(canonical_json(data)).hexdigest()


def test_a_bad_warm_start_spec_is_one_line_naming_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"policy\.init\.keep: must be <= candidates"):
        _cfg(tmp_path, **{"policy.init": {**INIT, "keep": 9}})
    _cfg(tmp_path, **{"policy.init": {**INIT, "keep": 4, "paradigms": ["react"]}})  # 3 + 1
    with pytest.raises(ConfigError, match=r"policy\.init\.keep: must be <= candidates \+"):
        _cfg(tmp_path, **{"policy.init": {**INIT, "keep": 5, "paradigms": ["react"]}})
    for bad in (["random"], ["searched"], ["template", "template"]):
        with pytest.raises(ConfigError, match=r"policy\.init\.paradigms: expected distinct"):
            _cfg(tmp_path, **{"policy.init": {**INIT, "paradigms": bad}})
    with pytest.raises(ConfigError, match=r"policy\.init\.kind"):
        _cfg(tmp_path, **{"policy.init": {**INIT, "kind": "rl"}})


def test_a_session_without_the_fitted_weights_says_what_to_do(tmp_path):
    plain = load_config(None, {**SMALL, "store.root": str(tmp_path / "runs")})
    init_state(plain)  # a kept backbone of the same shape must not be handed out instead
    with pytest.raises(ValueError, match=r"policy\.init\.ref is unset"):
        init_state(_cfg(tmp_path))


@pytest.mark.parametrize("renderer", sorted(RENDERERS))
def test_the_policy_never_sees_a_record_id_index_or_split(renderer):
    """What a real orchestrator sees: the family and the task's text, never the simulated
    suite's bookkeeping (record id, ``[sim <family> <split> #<index>]`` tag)."""
    for split in ("train", "heldout"):
        for record in make_sim_suite(2, 0, split):
            ep = Episode(record, default_catalogue(), SMALL_LIMITS, SimExecutor(), evaluate)
            while not ep.stopped:
                text = RENDERERS[renderer](public_state(ep, 0.5, 0.0))
                assert record.record_id not in text
                assert "[sim " not in text and f"{split} #" not in text
                if renderer != "compact_no_task":
                    task_head = record.prompt.split("] ", 1)[1][:30]
                    assert task_head in text  # the task's own text is shown
                ep.apply(ep.legal_actions()[0])


SMALL_LIMITS = load_config(None, {"budget.max_actions": 4}).budget


def test_the_in_process_path_finds_the_stored_weights_again(tmp_path, monkeypatch):
    calls = []
    original = ws.store_warm_start
    monkeypatch.setattr(ws, "store_warm_start", lambda c, s: calls.append(1) or original(c, s))
    first = ws.stage_warm_start(_cfg(tmp_path))
    again = ws.stage_warm_start(_cfg(tmp_path))
    assert first == again and len(calls) == 1


@pytest.mark.slow
def test_rho_with_the_warm_start_beats_the_random_init_rho_on_held_out_tasks(tmp_path):
    """The point of the prior (SIMULATED, table2-sim testbed, smaller): ρ fitted on training
    tasks wins more held-out episodes (disjoint records) than ρ on the random backbone."""
    from evosteer_core.evaluation.rollouts import evaluate_policy

    path = Path(__file__).resolve().parents[1] / "configs" / "table2-sim.yaml"
    over = {"store.root": str(tmp_path / "runs"), "sim.n_heldout_per_family": 8}
    over |= {"skills.enabled": False, "policy.init": {"kind": "sft"}}
    warm_cfg = ws.stage_warm_start(load_config(path, over))
    plain_cfg = load_config(path, {**over, "policy.init": None})
    scores = {}
    for name, cfg in (("warm", warm_cfg), ("plain", plain_cfg)):
        s = open_session(cfg, init_state(cfg))
        scores[name] = evaluate_policy(s, s.world.heldout_records, False, 2, "warm-check")
    assert scores["warm"] > scores["plain"] + 0.05, scores


def test_the_warm_start_paradigms_are_fixed_paradigms_of_the_registry():
    from evosteer_core.infra.config import WARM_START_PARADIGMS
    from evosteer_core.paradigms.registry import FIXED

    assert set(WARM_START_PARADIGMS) == set(FIXED) - {"random"}


@pytest.mark.parametrize("name", ["template", "plan_execute", "react"])
def test_a_paradigm_candidate_is_the_paradigm_s_episode_charged_as_rho_s(
    tmp_path, monkeypatch, name
):
    """The paradigm decides as on a plain episode of the same task and key (here the budget
    covers ρ's charges): the same actions in order. Each choice among several legal actions
    is one demonstration (that action, that legal set) charged its prompt and action tokens,
    counted here again; a forced action is free and no demonstration."""
    from evosteer_core.paradigms.registry import paradigm

    cfg = _cfg(tmp_path, **{"budget.max_actions": 12})
    world = ws.world_for(cfg, ws.load_split(cfg, "train"), [])
    policy = ws.load_policy(replace(cfg.policy, init=None), seed=0)
    search = ws._Searcher(cfg, world, policy)
    record = world.train_records[0]

    applied = []
    plain_apply = Episode.apply

    def recording(self, action, decision=None):
        applied.append((action.to_json(), len(self.legal_actions())))
        return plain_apply(self, action, decision)

    monkeypatch.setattr(Episode, "apply", recording)
    paradigm(name).run(search.episode(record, f"warm-start/{name}"))
    plain = list(applied)
    applied.clear()
    cand = search.paradigm_candidate(record, name)
    assert [a for a, _ in applied] == [a for a, _ in plain] == list(cand.actions)
    choices = [(a, n) for a, n in plain if n > 1]
    assert [d.action for d in cand.demos] == [a for a, _ in choices] and choices
    tok = policy.tokenizer
    demos = iter(cand.demos)
    for (action, n_legal), charge in zip(plain, cand.charges, strict=True):
        if n_legal == 1:
            assert (charge.tokens_in, charge.tokens_out) == (0, 0)
            continue
        demo = next(demos)
        assert action in demo.legal and len(demo.legal) == n_legal
        assert charge.tokens_in == len(tok.encode_prompt(demo.prompt)) > 0
        assert charge.tokens_out == len(tok.encode_action(action)) > 0


def test_paradigm_candidates_are_scored_and_kept_by_the_search_rule(tmp_path, monkeypatch):
    """With the paradigms scoring best, ``keep`` = 2 keeps exactly their demonstrations, the
    sequence with fewer decisions first (the search's tie rule)."""
    spec = {**INIT, "keep": 2, "paradigms": ["template", "plan_execute"]}
    cfg = _cfg(tmp_path, **{"policy.init": spec})
    world = ws.world_for(cfg, ws.load_split(cfg, "train"), [])
    policy = ws.load_policy(replace(cfg.policy, init=None), seed=0)
    scored = []

    def score(self, record, index, cand):
        scored.append(index)
        return 1.0 if index >= INIT["candidates"] else 0.1

    monkeypatch.setattr(ws._Searcher, "score", score)
    demos, summary = ws.search_demonstrations(cfg, world, policy)
    tasks = ws.warm_start_tasks(world.train_records, 1)
    assert scored == [0, 1, 2, 3, 4] * len(tasks)
    search = ws._Searcher(cfg, world, policy)
    expected = []
    for r in tasks:
        cands = [search.paradigm_candidate(r, n).demos for n in ("template", "plan_execute")]
        for demos_of in sorted(cands, key=len):  # a stable sort: equal lengths keep their order
            expected += demos_of
    assert demos == expected and summary["kept_sequences"] == 2 * len(tasks)


if __name__ == "__main__":  # RECORD: the sha256 of INIT's weights by the code on PYTHONPATH
    import tempfile

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        weights, _ = ws.warm_start_weights(_cfg(Path(tmp)))
    print(machine_key(), hashlib.sha256(weights).hexdigest())
