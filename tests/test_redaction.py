"""Credentials in URLs never reach what is logged or stored (docs/reliability.md,
"Credentials in URLs"): ``redact_url`` itself, and a train whose executor, retriever, tracking
URI and S3 endpoint carry planted secrets."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from fault_server import FaultServer
from mlflow import MlflowClient
from pipeline_support import isolate_flyte_cache, small_config

from evosteer_core.episode.world import stage_data
from evosteer_core.infra.config import load_config
from evosteer_core.infra.redact import redact_text, redact_url, redact_urls
from evosteer_core.infra.runs import config_hash, run_config, run_id_for
from evosteer_core.infra.tracking import resolve_tracking
from evosteer_flyte.cli import main as cli_main
from evosteer_flyte.workflows.train import train

AIME = Path(__file__).parent / "data" / "benchmarks" / "aime.jsonl"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://user:pw@host:8000/v1", "http://REDACTED@host:8000/v1"),
        (
            "https://tok@h/x?a=1&api_key=K&Token=T#f",
            "https://REDACTED@h/x?a=1&api_key=REDACTED&Token=REDACTED#f",
        ),
        ("sqlite:////abs/mlflow.db?password=P", "sqlite:////abs/mlflow.db?password=REDACTED"),
        ("s3://bucket/prefix", "s3://bucket/prefix"),
        ("http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1"),
        ("no url at all: a@b?token=x", "no url at all: a@b?token=x"),
    ],
)
def test_redact_url(url, shown):
    assert redact_url(url) == shown


def test_redact_text_and_plain_data():
    message = "HTTPConnectionPool(host='h', port=1): url: /v1?key=K1 (http://u:K2@h/x)"
    assert "K1" not in redact_text(message) and "K2" not in redact_text(message)
    data = {"a": ["http://u:S@h", 3, None], "b": ("x", "http://h?secret=S")}
    assert redact_urls(data) == {
        "a": ["http://REDACTED@h", 3, None],
        "b": ("x", "http://h?secret=REDACTED"),
    }


def test_config_hashes_unchanged_without_credentials_and_equal_for_the_redacted_form(tmp_path):
    """A config without credentials hashes as before (its public form is itself); with
    credentials, the real and the stored (redacted) config hash alike."""
    plain = small_config(tmp_path)
    assert plain.public_dict() == plain.to_dict()
    base = {"executor.kind": "openai", "executor.model": "m", "store.root": str(tmp_path)}
    real = load_config(None, {**base, "executor.base_url": "http://u:S1@h:1/v1"})
    other = load_config(None, {**base, "executor.base_url": "http://u:S2@h:1/v1"})
    stored = load_config(None, {**base, "executor.base_url": "http://REDACTED@h:1/v1"})
    elsewhere = load_config(None, {**base, "executor.base_url": "http://h:2/v1"})
    assert config_hash(real) == config_hash(other) == config_hash(stored)
    assert config_hash(real) != config_hash(elsewhere)


SECRETS = ("S3CRET-BASE", "S3CRET-RETRIEVER", "S3CRET-RTOKEN", "S3CRET-TRACK", "S3CRET-S3")


def test_planted_secrets_never_reach_the_run_dir_mlflow_or_the_report(
    tmp_path, monkeypatch, capsys
):
    """Before: executor.base_url (and every other URL) was stored verbatim in the MLflow
    params, the config.yaml artifact and the run index's config object."""
    isolate_flyte_cache(monkeypatch, tmp_path / "home")
    monkeypatch.delenv("MLFLOW_S3_ENDPOINT_URL", raising=False)  # restored after the test
    root = tmp_path / "run"
    with FaultServer("ok") as srv:
        cfg = small_config(
            root,
            **{
                "train.batch_size": 3,
                "data.source": "benchmarks",
                "data.train": [{"name": "aime", "path": str(AIME)}],
                "executor.kind": "openai",
                "executor.base_url": f"http://evo:{SECRETS[0]}@127.0.0.1:{srv.port}/v1",
                "executor.model": "m",
                "executor.timeout_s": 5.0,
                "executor.retries": 0,
                "executor.retriever": {
                    "kind": "http",
                    "url": f"http://r:{SECRETS[1]}@127.0.0.1:9/search?token={SECRETS[2]}",
                },
                "tracking.tracking_uri": f"sqlite:///{root}/mlflow.db?token={SECRETS[3]}",
                "store.s3_endpoint": f"http://s3:{SECRETS[4]}@127.0.0.1:9",
            },
        )
        out = train(config_yaml=cfg.to_yaml(), steps=1)
    assert out.run_id == run_id_for(stage_data(cfg))  # the run hashes its stored data, not the path
    # the executor connected with the real URL: its credentials as HTTP basic auth
    basic = "Basic " + base64.b64encode(f"evo:{SECRETS[0]}".encode()).decode()
    assert srv.log and {r.header("Authorization") for r in srv.log} == {basic}

    report = tmp_path / "report.html"
    assert (
        cli_main(["report", "--run-dir", str(root), "--run", out.run_id, "--out", str(report)]) == 0
    )
    printed = capsys.readouterr().out
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert report in files and (root / "mlflow.db") in files
    for secret in SECRETS:
        assert secret not in printed
        assert not [p for p in tmp_path.rglob(f"*{secret}*")], secret  # file names
        leaks = [p for p in files if secret.encode() in p.read_bytes()]
        assert not leaks, (secret, leaks)
    run = MlflowClient(resolve_tracking(cfg.tracking, cfg.store)[0]).get_run(out.mlflow_run)
    shown = " ".join([*run.data.params.values(), *run.data.tags.values()])
    assert run.data.params["executor.base_url"] == f"http://REDACTED@127.0.0.1:{srv.port}/v1"
    assert not [s for s in SECRETS if s in shown]
    # the stored config is the redacted one and hashes as the run does
    from evosteer_core.infra.artifacts import open_store

    stored = run_config(open_store(str(root)), out.run_id)
    assert stored.executor.base_url == f"http://REDACTED@127.0.0.1:{srv.port}/v1"
    assert run_id_for(stored) == out.run_id
