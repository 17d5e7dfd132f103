"""The experiment: its config section, its cells, the paired table (checked against a
computation written here), and the workflow end to end with a crash and a resume that runs
only the missing cells."""

from __future__ import annotations

import contextlib
import math
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from evosteer_core.experiment.cells import experiment_cells, experiment_id, longest_first
from evosteer_core.experiment.table import experiment_table, paired_difference
from evosteer_core.infra.config import load_config
from evosteer_core.infra.configio import ConfigError
from evosteer_core.infra.runs import config_hash, run_id_for

REPO = Path(__file__).resolve().parents[1]

ROWS = [
    {"name": "AnchorTB"},
    {"name": "TB", "set": {"train.objective": "tb"}},
    {"name": "untrained", "eval": "untrained"},
]


def _cfg(rows=ROWS, **experiment):
    return load_config(None, {"experiment": {"rows": rows, "seeds": [1, 2], **experiment}})


def test_a_cell_is_the_base_run_with_the_rows_overrides_and_the_seed():
    cfg = _cfg()
    cells = experiment_cells(cfg)
    assert [(c.row.name, c.seed) for c in cells] == [
        ("AnchorTB", 1),
        ("AnchorTB", 2),
        ("TB", 1),
        ("TB", 2),
        ("untrained", 1),
        ("untrained", 2),
    ]
    tb = cells[2].config
    assert tb.train.objective == "tb" and tb.train.seed == 1 and tb.experiment is None
    base = load_config(None, {"train.seed": 1})
    assert run_id_for(cells[0].config) == run_id_for(base)  # an ordinary run, no trace of rows
    assert "experiment" not in cells[0].config.to_dict()
    # an evaluation-only row without overrides is the reference's run at step 0
    assert [run_id_for(c.config) for c in cells[4:]] == [run_id_for(c.config) for c in cells[:2]]
    assert len({run_id_for(c.config) for c in cells}) == 4


def test_the_experiment_section_is_not_part_of_the_runs_identity():
    with_rows, without = _cfg(), load_config(None)
    assert config_hash(with_rows) == config_hash(without)
    assert "experiment" not in without.to_dict()
    assert experiment_id(with_rows) != experiment_id(_cfg(rows=ROWS[:2]))
    assert experiment_id(with_rows) == experiment_id(_cfg())


@pytest.mark.parametrize(
    "rows, extra, path, words",
    [
        ([{"name": "a", "set": {"train.seed": 3}}], {}, "experiment.rows[0]", "experiment's"),
        ([{"name": "a", "set": {"store.root": "x"}}], {}, "experiment.rows[0]", "experiment's"),
        ([{"name": "a", "eval": "magic"}], {}, "experiment.rows[0]", "paradigm:<name>"),
        ([{"name": "a"}, {"name": "a"}], {}, "experiment.rows", "unique"),
        ([{"name": "a"}], {"reference": "b"}, "experiment.reference", "not a row"),
        ([{"name": "a", "colour": 1}], {}, "experiment.rows[0].colour", "unknown key"),
        ([{"name": "a"}], {"seeds": [1, 1]}, "experiment.seeds", "repeated"),
    ],
)
def test_a_bad_experiment_section_names_the_key(rows, extra, path, words):
    with pytest.raises(ConfigError) as err:
        _cfg(rows=rows, **extra)
    assert err.value.path.startswith(path) and words in str(err.value)


def test_a_bad_override_names_the_row_and_the_key():
    cfg = _cfg(rows=[{"name": "a"}, {"name": "bad", "set": {"train.batch_size": "many"}}])
    with pytest.raises(ConfigError) as err:
        experiment_cells(cfg)
    assert "experiment.rows[1] (bad)" in err.value.source and err.value.path == "train.batch_size"


def _trajectories(rng, records, runs, families, shift=0.0):
    rows = [
        {
            "record_id": f"{f}-{i}",
            "family": f,
            "run": k,
            "tokens": 100.0 + i,
            "reward": float(rng.random() < 0.5 + shift),
        }
        for f in families
        for i in range(records)
        for k in range(runs)
    ]
    return pd.DataFrame(rows)


def test_trained_cells_run_first_then_the_rows_order_seed_by_seed():
    rows = [{"name": "untrained", "eval": "untrained"}, *ROWS[:2]]
    order = [c.label for c in longest_first(experiment_cells(_cfg(rows)))]
    assert order == [
        "AnchorTB / seed 1",
        "AnchorTB / seed 2",
        "TB / seed 1",
        "TB / seed 2",
        "untrained / seed 1",
        "untrained / seed 2",
    ]


def test_the_paired_difference_and_its_standard_error_by_hand():
    rng = np.random.default_rng(0)
    families = ["hotpotqa", "aime"]
    row = {s: _trajectories(rng, 3, 2, families, 0.2) for s in (1, 2, 3)}
    ref = {s: _trajectories(rng, 3, 2, families) for s in (1, 2, 3)}
    per_seed = []
    for s in (1, 2, 3):  # per family: mean over (record, run) pairs of row − reference
        fam_means = []
        for f in families:
            a = row[s][row[s].family == f].sort_values(["record_id", "run"])["reward"].to_numpy()
            b = ref[s][ref[s].family == f].sort_values(["record_id", "run"])["reward"].to_numpy()
            fam_means.append(float(np.mean(a - b)))
        per_seed.append(np.mean(fam_means))
    d = paired_difference(row, ref)
    assert d.mean == pytest.approx(np.mean(per_seed))
    assert d.se == pytest.approx(np.std(per_seed, ddof=1) / math.sqrt(3))
    assert d.seeds == 3
    assert d.per_seed == pytest.approx(per_seed) and d.to_dict()["per_seed"] == list(d.per_seed)
    assert math.isnan(paired_difference({1: row[1]}, {1: ref[1]}).se)


def test_unpaired_cells_are_refused():
    rng = np.random.default_rng(1)
    a, b = _trajectories(rng, 3, 2, ["aime"]), _trajectories(rng, 2, 2, ["aime"])
    with pytest.raises(ValueError, match="same trajectories"):
        paired_difference({1: a}, {1: b})


def test_the_table_scores_each_family_over_seeds_and_runs():
    from evosteer_core.episode.records import FAMILIES

    rng = np.random.default_rng(2)
    cells = {(n, s): _trajectories(rng, 2, 2, FAMILIES) for n in ("A", "B") for s in (1, 2)}
    table = experiment_table(
        [("A", "checkpoint"), ("B", "untrained")],
        cells,
        "A",
        2,
        True,
        {("A", 1): {"update_ms_per_episode": 3.0}, ("A", 2): {"update_ms_per_episode": 5.0}},
    )
    a = table.rows[0]
    hot = [
        cells[("A", s)].query("family == 'hotpotqa' and run == @k")["reward"].mean()
        for s in (1, 2)
        for k in (0, 1)
    ]
    assert a.table.benchmarks[0].mean == pytest.approx(np.mean(hot))
    assert a.table.benchmarks[0].std == pytest.approx(np.std(hot, ddof=1))
    assert a.table.groups[0].name == "iid avg" and a.difference is None
    assert (
        a.costs["update_ms_per_episode"] == 4.0
        and "update_ms_per_episode" not in table.rows[1].costs
    )
    md = table.markdown()
    assert "SIMULATED" in md and "Δ vs A ± SE" in md and "(reference)" in md


def test_the_table_shows_each_seeds_mean_and_paired_difference():
    from evosteer_core.episode.records import FAMILIES
    from evosteer_core.experiment.report import render_html

    rng = np.random.default_rng(3)
    cells = {
        (n, s): _trajectories(rng, 2, 2, FAMILIES, shift)
        for n, shift in (("A", 0.0), ("B", 0.2))
        for s in (5, 9)
    }
    table = experiment_table([("A", "checkpoint"), ("B", "untrained")], cells, "A", 2, True)
    means = {}  # by hand: per family the mean over its (record, run) rewards, then their average
    for (name, seed), frame in cells.items():
        fams = [np.mean(frame.reward[frame.family == f].to_numpy()) for f in FAMILIES]
        means[(name, seed)] = float(np.mean(fams))
    a, b = table.rows
    assert a.seed_means == pytest.approx([means[("A", 5)], means[("A", 9)]])
    assert b.seed_means == pytest.approx([means[("B", 5)], means[("B", 9)]])
    # with every (record, run) paired, a seed's difference is the difference of its means
    assert b.difference.per_seed == pytest.approx(
        [means[("B", s)] - means[("A", s)] for s in (5, 9)]
    )
    md = table.markdown()
    seed_line = next(line for line in md.splitlines() if line.startswith("| B |") and "Δ" in line)
    d9 = 100 * (means[("B", 9)] - means[("A", 9)])
    assert f"{100 * means[('B', 9)]:.2f} (Δ {d9:+.2f})" in seed_line
    assert "| row | seed 5 | seed 9 |" in md
    assert table.to_dict()["rows"][1]["seed_means"] == list(b.seed_means)
    assert "seed-table" in render_html(table, "x")


# ---- the workflow, end to end ------------------------------------------------------------


def _small_experiment(
    root, rows=({"name": "AnchorTB"}, {"name": "untrained", "eval": "untrained"}), steps=1
):
    from tests.pipeline_support import SMALL

    return load_config(
        None,
        {
            **SMALL,
            "store.root": str(root),
            "train.steps": steps,
            "train.batch_size": 2,
            "sim.n_heldout_per_family": 1,
            "skills.enabled": False,
            "objectives.cost_metrics": True,
            "experiment": {
                "rows": list(rows),
                "seeds": [7],
                "runs": 2,
            },
        },
    )


def test_a_crashed_experiment_reruns_only_its_missing_cells(tmp_path, monkeypatch, capsys):
    from evosteer_flyte import cli
    from evosteer_flyte.tasks import experiment as tasks
    from tests.pipeline_support import count_stage_calls, isolate_flyte_cache

    isolate_flyte_cache(monkeypatch, tmp_path / "home")
    cfg = _small_experiment(tmp_path / "runs")
    path = tmp_path / "exp.yaml"
    path.write_text(cfg.to_yaml())
    evaluated = []
    real = tasks.cell_trajectories

    def crash_on_untrained(cfg_, state, evaluation, runs, searched):
        evaluated.append(evaluation)
        if evaluation == "untrained" and crash:
            raise RuntimeError("node lost")
        return real(cfg_, state, evaluation, runs, searched)

    monkeypatch.setattr(tasks, "cell_trajectories", crash_on_untrained)
    crash = True
    assert cli.main(["experiment", "--config", str(path)]) == 1
    assert "node lost" in capsys.readouterr().err
    assert evaluated == ["checkpoint", "untrained"]

    crash, evaluated[:] = False, []
    stages = count_stage_calls(monkeypatch)
    assert cli.main(["experiment", "--config", str(path)]) == 0
    assert evaluated == ["untrained"]  # the trained cell's evaluation was a cache hit
    assert not stages  # and none of its training stages ran again
    out = capsys.readouterr().out
    exp_id = experiment_id(cfg)
    assert out.strip().splitlines()[-1] == exp_id
    assert "| AnchorTB |" in out and "| untrained |" in out
    page = (tmp_path / "runs" / f"experiment-{exp_id}.html").read_text()
    assert "experiment-table" in page and "data:image/png;base64," in page

    import mlflow

    from evosteer_core.infra.tracking import resolve_tracking

    uri, _ = resolve_tracking(cfg.tracking, cfg.store)
    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("evosteer.workflow") == "experiment"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert sorted(r.data.tags["evosteer.row"] for r in children) == ["AnchorTB", "untrained"]
    assert all("heldout.mean" in r.data.metrics for r in children)


def test_jobs_run_each_cell_in_a_worker_and_the_table_from_their_cache(
    tmp_path, monkeypatch, capfd
):
    """``--jobs 2``: one worker process per cell (not per row: a row's seeds run at once),
    a line per finished cell and the workers' progress lines (written by those processes, so
    captured at the file descriptor), then the experiment workflow in this process finds every
    training stage in the cache the workers filled."""
    from evosteer_flyte import cli
    from tests.pipeline_support import count_stage_calls, isolate_flyte_cache

    isolate_flyte_cache(monkeypatch, tmp_path / "home")
    cfg = _small_experiment(tmp_path / "runs")
    path = tmp_path / "exp.yaml"
    path.write_text(cfg.to_yaml())
    stages = count_stage_calls(monkeypatch)  # this process only: the workers are not counted
    assert cli.main(["experiment", "--config", str(path), "--jobs", "2"]) == 0
    assert not stages
    lines = capfd.readouterr().out.splitlines()
    done = sorted(line.split("] ", 1)[1] for line in lines if line.startswith("  ["))
    assert [d.rsplit(":", 1)[0] for d in done] == ["AnchorTB / seed 7", "untrained / seed 7"]
    assert any(line.startswith("  [2/2] ") for line in lines)
    assert any(line.startswith("  AnchorTB / seed 7: step 1/1 (") for line in lines)
    assert "| AnchorTB |" in "\n".join(lines)


def _children(pid: int) -> list[int]:
    """The live processes whose parent is ``pid`` (from /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                out.append(int(stat.parent.name))
    return out


def _alive(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return False


def test_sigterm_stops_an_experiments_workers_at_once(tmp_path):
    """Before: SIGTERM (``kill``, a scheduler stopping the job) raised ``SystemExit`` in the
    parent of ``--jobs 2``, whose process pool then waited for both running cells and the
    queued one to finish before exiting (hours at table2-sim's scale). Now the queued cell is
    cancelled and the workers stop with the parent, which exits 143 in seconds."""
    trained = ({"name": "AnchorTB"}, {"name": "TB", "set": {"train.objective": "tb"}})
    queued = {"name": "untrained", "eval": "untrained"}  # two workers: this cell waits
    cfg = _small_experiment(tmp_path / "runs", (*trained, queued), steps=200)
    path = tmp_path / "exp.yaml"
    path.write_text(cfg.to_yaml())
    proc = subprocess.Popen(
        [sys.executable, "-m", "evosteer_flyte.cli", "experiment", "--config", str(path)]
        + ["--jobs", "2"],
        cwd=REPO,
        env={**os.environ, "HOME": str(tmp_path / "home")},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(ln) for ln in proc.stdout], daemon=True).start()
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 300
        while not any(": step 1/200 (" in ln for ln in seen):  # a cell is training
            assert proc.poll() is None and time.monotonic() < deadline, "".join(seen)[-3000:]
            with contextlib.suppress(queue.Empty):
                seen.append(lines.get(timeout=1))
        workers = _children(proc.pid)
        assert len(workers) >= 2  # the two cell workers (and the pool's resource tracker)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 143
        deadline = time.monotonic() + 30
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_alive(w) for w in workers)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_cells_progress_is_a_line_per_tenth_of_its_steps(capsys):
    """The stage records of 20 steps (each step's stages, as ``stage_io`` logs them) print a
    line when a step starts a new tenth: steps 1, 2, 4, ..., 20; other records print none."""
    import logging

    from evosteer_flyte.console import CellProgress

    log = logging.getLogger("evosteer_core.pipeline.stage_io")
    with CellProgress("AnchorTB / seed 42", 20):
        for step in range(1, 21):
            for stage in ("rollout", "rescore", "update"):
                log.info("step %d: %s", step, stage, extra={"stage": stage, "step": step})
            log.info("no stage here", extra={"step": step})
    log.info("step %d: %s", 21, "rollout", extra={"stage": "rollout", "step": 21})  # detached
    lines = capsys.readouterr().out.splitlines()
    steps = [int(line.split("step ")[1].split("/")[0]) for line in lines]
    assert steps == [1, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20]
    assert all(line.startswith("  AnchorTB / seed 42: step ") and "/20 (" in line for line in lines)
