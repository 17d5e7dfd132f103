"""The ``evosteer`` command line as a person at the terminal meets it (issue 16 item 8): a
usage or config error is one line on stderr naming what, where and what was expected, exit
status 2, the traceback only with ``--debug``; a bad ``--set`` blames the override, not the
config file; ``replay`` exits 0 identical / 1 differs / 2 error; ``--steps 0`` is refused;
``--version``; help text for every option. None of these runs a training step."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from cli_support import cli_fails as _fails

from evosteer_core.infra.artifacts import RunIndex, open_store
from evosteer_core.infra.configio import InputError
from evosteer_flyte.cli import build_parser, main


def test_missing_config_file_is_one_line_exit_2(tmp_path, capsys):
    missing = tmp_path / "nope.yaml"
    code, line = _fails(["train", "--config", str(missing)], capsys)
    assert code == 2
    assert line == (
        f"evosteer train: --config {missing}: no such file "
        "(expected a YAML run config, e.g. configs/tiny-sim.yaml)"
    )
    code, line = _fails(["train", "--config", str(tmp_path)], capsys)
    assert code == 2 and f"--config {tmp_path}: is a directory" in line


def test_unknown_key_in_the_file_names_file_key_and_known_keys(tmp_path, capsys):
    config = tmp_path / "x.yaml"
    config.write_text("name: x\nstore: {root: runs}\ntrain: {stpes: 3}\n", encoding="utf-8")
    code, line = _fails(["train", "--config", str(config)], capsys)
    assert code == 2
    assert line.startswith(f"evosteer train: {config}: train.stpes: unknown key (known keys: ")
    assert line.endswith("did you mean 'steps'?")


def test_bad_set_value_blames_the_override_not_the_config_file(capsys):
    code, line = _fails(["train", "--set", "train.batch_size=abc"], capsys)
    assert code == 2
    assert line == "evosteer train: --set train.batch_size=abc: expected int, found str 'abc'"


def test_unknown_key_and_malformed_set_blame_the_override(capsys):
    code, line = _fails(["train", "--set", "train.bogus=1"], capsys)
    assert code == 2
    assert line.startswith("evosteer train: --set train.bogus=1: unknown key (known keys: ")
    code, line = _fails(["train", "--set", "train.batch_size"], capsys)
    assert code == 2
    assert line == "evosteer train: --set train.batch_size: expected KEY=VALUE (e.g. train.steps=5)"


def test_a_check_across_keys_names_the_file_and_the_overrides(capsys):
    argv = ["train", "--set", "train.rollouts_theta=0", "--set", "train.rollouts_rho=0"]
    code, line = _fails(argv, capsys)
    assert code == 2
    assert line == (
        "evosteer train: evosteer_core/data/tiny-sim.yaml with --set train.rollouts_theta=0 "
        "--set train.rollouts_rho=0: train: rollouts_theta + rollouts_rho: must be > 0"
    )


def test_debug_shows_the_traceback(capsys):
    with pytest.raises(InputError, match=r"--set train.batch_size=abc: expected int"):
        main(["--debug", "train", "--set", "train.batch_size=abc"])
    with pytest.raises(InputError):
        main(["train", "--debug", "--set", "train.batch_size=abc"])


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_steps_below_one_is_an_error_not_all_steps(value, capsys):
    code, line = _fails(["train", "--steps", value], capsys)
    assert code == 2
    assert line == (
        f"evosteer train: argument --steps: expected an integer ≥ 1, found {value!r} "
        "(see evosteer train --help)"
    )


def test_version(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"evosteer {version('evosteer')}"


def test_every_option_has_help_text():
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    missing = []
    for name, command in [("evosteer", parser), *sub.choices.items()]:
        for action in command._actions:
            if action.option_strings and not (action.help or "").strip():
                missing.append(f"{name} {'/'.join(action.option_strings)}")
    assert not missing, missing
    assert {c.dest for c in sub._choices_actions} == set(sub.choices)
    assert all(c.help for c in sub._choices_actions)  # every command has a line too


def _run_with_step_zero(root: Path, run_id: str) -> None:
    """A run index holding only step 0 (enough for the commands to find the run)."""
    store = open_store(str(root))
    RunIndex(store, run_id).record(0, "state", store.put_bytes(b"not a real state", "state"))


@pytest.mark.parametrize("command", ["replay", "evaluate", "report"])
def test_a_missing_run_is_exit_2_and_lists_the_runs_there(command, tmp_path, capsys):
    extra = ["--step", "1"] if command == "replay" else []
    argv = [command, "--run-dir", str(tmp_path), "--run", "nope", *extra]
    code, line = _fails(argv, capsys)
    assert code == 2
    assert line == f"evosteer {command}: --run nope: no such run in {tmp_path} (no runs there)"

    _run_with_step_zero(tmp_path, "tiny-sim-abc")
    code, line = _fails(argv, capsys)
    assert code == 2
    assert line.endswith(f"no such run in {tmp_path} (runs there: tiny-sim-abc)")


def test_replay_of_a_step_that_was_not_recorded_is_exit_2(tmp_path, capsys):
    _run_with_step_zero(tmp_path, "r1")
    argv = ["replay", "--run-dir", str(tmp_path), "--run", "r1", "--step", "3"]
    code, line = _fails(argv, capsys)
    assert code == 2
    assert line == "evosteer replay: --step 3: run r1 has no step 3 (recorded: 0–0)"
    code, line = _fails([*argv[:-1], "0"], capsys)
    assert code == 2 and "argument --step: expected an integer ≥ 1, found '0'" in line


def test_replay_that_cannot_run_is_exit_2_not_1(tmp_path, capsys):
    """Steps 0 and 1 recorded but no config entry: the replay fails (before: exit 1, the
    status of "an artifact differs")."""
    _run_with_step_zero(tmp_path, "r1")
    store = open_store(str(tmp_path))
    RunIndex(store, "r1").record(1, "state", store.put_bytes(b"another", "state"))
    code, line = _fails(
        ["replay", "--run-dir", str(tmp_path), "--run", "r1", "--step", "1"], capsys
    )
    assert code == 2
    assert line.startswith("evosteer replay: ") and "config" in line


def test_the_command_exits_with_mains_status_after_freezing_the_collector(monkeypatch):
    """``evosteer`` (``cli.run``) skips the interpreter's last collections: it freezes the
    collector once main has returned, and exits with main's status."""
    from evosteer_flyte import cli

    calls: list[str] = []
    monkeypatch.setattr(cli, "main", lambda: calls.append("main") or 3)
    monkeypatch.setattr(cli.gc, "freeze", lambda: calls.append("freeze"))
    with pytest.raises(SystemExit) as exc:
        cli.run()
    assert exc.value.code == 3 and calls == ["main", "freeze"]
