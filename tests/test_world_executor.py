"""The ``openai`` executor as the config builds it: retriever, environment factory, API key,
and the world-build check that a configured family's tools and environment exist."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import textworld
from json_server import JSONServer

from evosteer_core.benchmarks.textworld_suite import GameSpec
from evosteer_core.episode.actions import Action
from evosteer_core.episode.budget import BudgetLimits
from evosteer_core.episode.runtime import Episode
from evosteer_core.episode.world import build_executor, build_world
from evosteer_core.executors.textworld_env import TextWorldEnvironment, TextWorldFactory, game_file
from evosteer_core.infra.artifacts import LocalStore
from evosteer_core.infra.config import ConfigError, load_config
from evosteer_core.tools.search import BM25Retriever, HTTPRetriever

DATA = Path(__file__).parent / "data" / "benchmarks"
CORPUS = [
    {"doc_id": "hamlet", "text": "Hamlet is a tragedy written by William Shakespeare."},
    {"doc_id": "faust", "text": "Faust is a tragic play by Johann Wolfgang von Goethe."},
]


def openai_config(tmp_path: Path, train: list[dict] | None = None, **executor: object):
    """An openai-executor config over benchmark slices (the server is never called here)."""
    overrides: dict[str, object] = {
        "store.root": str(tmp_path / "store"),
        "executor.kind": "openai",
        "executor.base_url": "http://127.0.0.1:9/v1",
        "executor.model": "m",
        "data.source": "benchmarks",
        "data.train": train or [{"name": "aime", "path": str(DATA / "aime.jsonl")}],
    }
    overrides |= {f"executor.{k}": v for k, v in executor.items()}
    return load_config(None, overrides=overrides)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in CORPUS))
    return path


def test_a_bm25_corpus_file_becomes_the_executors_retriever(tmp_path, corpus):
    cfg = openai_config(tmp_path, retriever={"kind": "bm25", "corpus": str(corpus)})
    retriever = build_executor(cfg).retriever
    assert isinstance(retriever, BM25Retriever) and len(retriever) == 2
    assert [p.doc_id for p in retriever.search("who wrote Hamlet", 3)] == ["hamlet"]


def test_a_bm25_corpus_can_be_a_store_object_with_its_own_field_names(tmp_path):
    rows = [{"id": r["doc_id"], "body": r["text"]} for r in CORPUS]
    src = tmp_path / "renamed.jsonl"
    src.write_text("".join(json.dumps(row) + "\n" for row in rows))
    ref = LocalStore(tmp_path / "store").put_file(src)
    retriever_cfg = {
        "kind": "bm25",
        "corpus_ref": {"uri": ref.uri, "sha256": ref.sha256},
        "id_field": "id",
        "text_field": "body",
    }
    retriever = build_executor(openai_config(tmp_path, retriever=retriever_cfg)).retriever
    assert [p.doc_id for p in retriever.search("Goethe play", 3)] == ["faust"]
    missing = {**retriever_cfg, "corpus_ref": {"uri": ref.uri, "sha256": "0" * 64}}
    with pytest.raises(ValueError, match=r"^executor\.retriever\.corpus_ref: cannot index"):
        build_executor(openai_config(tmp_path, retriever=missing))


def test_a_bad_corpus_file_fails_at_build_time_naming_the_key(tmp_path, corpus):
    absent = {"kind": "bm25", "corpus": str(tmp_path / "absent.jsonl")}
    with pytest.raises(ValueError, match=r"^executor\.retriever\.corpus: cannot index .*absent"):
        build_executor(openai_config(tmp_path, retriever=absent))
    wrong_field = {"kind": "bm25", "corpus": str(corpus), "text_field": "body"}
    with pytest.raises(ValueError, match=r"corpus\.jsonl:1: expected a JSON object .* 'body'"):
        build_executor(openai_config(tmp_path, retriever=wrong_field))


def test_an_http_retriever_is_built_from_its_url(tmp_path):
    cfg = {"kind": "http", "url": "http://127.0.0.1:9/search", "timeout_s": 3}
    retriever = build_executor(openai_config(tmp_path, retriever=cfg)).retriever
    assert isinstance(retriever, HTTPRetriever)
    assert (retriever.url, retriever.timeout_s) == ("http://127.0.0.1:9/search", 3.0)


@pytest.mark.parametrize(
    ("retriever", "message"),
    [
        ({"kind": "bm25"}, "executor.retriever.corpus: kind 'bm25' needs exactly one of"),
        ({"kind": "http"}, "executor.retriever.url: kind 'http' needs an http"),
        (
            {"kind": "http", "url": "http://h/s", "corpus": "c.jsonl"},
            "executor.retriever.corpus: kind 'http' takes no corpus",
        ),
        ({"kind": "bm25", "corpus": "c", "url": "http://h/s"}, "url: only kind 'http'"),
    ],
)
def test_retriever_config_errors_name_the_key(tmp_path, retriever, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        openai_config(tmp_path, retriever=retriever)


def test_the_sim_executor_takes_neither_a_retriever_nor_an_environment():
    with pytest.raises(ConfigError, match="executor.retriever: only kind 'openai' uses one"):
        load_config(None, overrides={"executor.retriever": {"kind": "http", "url": "http://h"}})
    with pytest.raises(ConfigError, match="executor.environment: only kind 'openai'"):
        load_config(None, overrides={"executor.environment": "textworld"})
    with pytest.raises(ConfigError, match="executor.environment: expected 'textworld' | null"):
        load_config(None, overrides={"executor.environment": "alfworld"})


def test_the_api_key_comes_from_the_named_environment_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("EVOSTEER_TEST_KEY", "sk-test")
    executor = build_executor(openai_config(tmp_path, api_key_env="EVOSTEER_TEST_KEY"))
    assert executor._session.headers["Authorization"] == "Bearer sk-test"
    monkeypatch.delenv("EVOSTEER_TEST_KEY")
    with pytest.raises(ValueError, match="executor.api_key_env: .*'EVOSTEER_TEST_KEY' is not set"):
        build_executor(openai_config(tmp_path, api_key_env="EVOSTEER_TEST_KEY"))


def test_a_search_family_without_a_retriever_fails_at_world_build(tmp_path, corpus):
    hotpot = [{"name": "hotpotqa", "path": str(DATA / "hotpotqa.jsonl")}]
    with pytest.raises(ValueError) as info:
        build_world(openai_config(tmp_path, hotpot))
    assert str(info.value).startswith(
        "executor.retriever: family 'hotpotqa' (record 'hotpotqa/5a8b57f25542995d1e6f1371') "
        "uses the search tool and no retriever is configured; set executor.retriever"
    )
    world = build_world(
        openai_config(tmp_path, hotpot, retriever={"kind": "bm25", "corpus": str(corpus)})
    )
    assert world.executor.retriever is not None
    assert build_world(openai_config(tmp_path)).train_records  # aime needs python only


def test_an_interactive_family_needs_an_environment_that_can_run_it(tmp_path):
    alfworld = [{"name": "alfworld", "path": str(DATA / "alfworld.jsonl")}]
    with pytest.raises(ValueError) as info:
        build_world(openai_config(tmp_path, alfworld))
    assert str(info.value) == (
        "executor.environment: record 'alfworld/trial_T20190909_070538_437648' is interactive "
        "(alfworld) and no environment is configured; set executor.environment "
        "(available: textworld)"
    )
    with pytest.raises(ValueError) as info:
        build_world(openai_config(tmp_path, alfworld, environment="textworld"))
    assert str(info.value).startswith(
        "executor.environment: 'textworld' cannot run record "
        "'alfworld/trial_T20190909_070538_437648': record "
    )
    assert "is not a TextWorld game (meta.harness is 'alfworld')" in str(info.value)


def test_a_textworld_benchmark_plays_through_the_runtime_to_a_win(tmp_path, monkeypatch):
    """Config -> world -> openai executor -> runtime -> TextWorld: a scripted model sends the
    game's walkthrough as <act> calls; the reward is the game's own success."""
    monkeypatch.setenv("EVOSTEER_CACHE", str(tmp_path / "cache"))
    commands: list[str] = []
    requests: list[dict] = []

    def respond(path: str, body: dict, headers: dict[str, str]) -> tuple[int, dict]:
        requests.append(body)
        step = sum(m["content"].startswith("<act>") for m in body["messages"])
        text = f"<act>{commands[step]}</act>" if step < len(commands) else "Done: I won."
        choice = {"message": {"content": text}, "finish_reason": "stop"}
        return 200, {"choices": [choice], "usage": {"prompt_tokens": 50, "completion_tokens": 8}}

    with JSONServer(respond) as server:
        cfg = openai_config(
            tmp_path,
            [{"name": "textworld", "limit": 2}],
            base_url=f"{server.root}/v1",
            environment="textworld",
        )
        world = build_world(cfg)
        assert isinstance(world.executor.environment_factory, TextWorldFactory)
        task = world.train_records[0]
        ep = Episode(
            task, world.catalogue, BudgetLimits(), world.executor, world.evaluator, run_seed=1
        )
        assert isinstance(ep.environment, TextWorldEnvironment)
        path = game_file(GameSpec.of(task), tmp_path / "cache")
        commands += textworld.Game.load(str(path.with_suffix(".json"))).walkthrough
        ep.apply(Action("ADD_AGENT", node_id="n0", role_id="solver"))
        assert Action("STOP") not in ep.legal_actions()  # no output node yet
        ep.apply(Action("SET_OUTPUT", node_id="n0"))
        ep.apply(Action("STOP"))
    result = ep.history[0].result
    assert [u.query for u in result.tool_uses] == commands
    assert all(u.tool == "act" and u.ok for u in result.tool_uses)
    assert "<act>" in requests[0]["messages"][0]["content"]  # the system prompt teaches <act>
    assert "Environment observation:\nObjective: " in requests[0]["messages"][-1]["content"]
    for use, later in zip(result.tool_uses, requests[1:], strict=False):
        assert later["messages"][-1]["content"] == f"<result>{use.result}</result>"
    assert result.env_steps == ep.ledger.env_steps == ep.environment.steps_done == len(commands)
    assert ep.environment.success and ep.reward == 1.0
