"""``evosteer stage-data`` (issue 16): a remote launch with local benchmark files stores them
first. The command loads and checks every slice's file, stores its task table and writes a
config whose slices name the table by ``ref`` and no longer carry a path, so the launch needs
no local file; its run id is the one ``train`` would give the original config."""

from __future__ import annotations

import yaml

from evosteer_core.episode.world import load_records, stage_data
from evosteer_core.infra.config import load_config
from evosteer_core.infra.runs import run_id_for
from evosteer_flyte.cli import main

ROW = '{"question": "q%d", "answer": ["x%d"]}\n'


def _config(tmp_path, rows: str) -> tuple:
    data = tmp_path / "nq.jsonl"
    data.write_text(rows)
    cfg = load_config(None).to_dict()
    cfg["store"]["root"] = str(tmp_path / "store")
    cfg["data"] = {
        "source": "benchmarks",
        "train": [{"name": "nq_open", "path": str(data), "limit": 3}],
        "heldout": [{"name": "nq_open", "path": str(data), "offset": 3}],
    }
    path = tmp_path / "bench.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, data


def test_staged_config_names_the_tables_and_runs_without_the_file(tmp_path, capsys):
    path, data = _config(tmp_path, "".join(ROW % (i, i) for i in range(5)))
    out = tmp_path / "staged.yaml"
    assert main(["stage-data", "--config", str(path), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"data.train[0] nq_open: {data} -> " in err and "data.heldout[0] nq_open" in err
    staged = load_config(out)
    original = stage_data(load_config(path))
    assert run_id_for(staged) == run_id_for(original)  # what train would run
    assert f"wrote {out} (run {run_id_for(original)})" in err
    for sl in (*staged.data.train, *staged.data.heldout):
        assert sl.path is None and sl.ref == original.data.train[0].ref
    data.unlink()  # the launch has no local file: the records come from the store
    train, heldout = load_records(staged)
    assert [r.answers for r in train] == [("x0",), ("x1",), ("x2",)]
    assert [r.answers for r in heldout] == [("x3",), ("x4",)]


def test_without_out_the_config_goes_to_stdout(tmp_path, capsys):
    path, _ = _config(tmp_path, "".join(ROW % (i, i) for i in range(5)))
    assert main(["stage-data", "--config", str(path)]) == 0
    text = capsys.readouterr().out
    assert yaml.safe_load(text)["data"]["train"][0]["ref"]["sha256"]


def test_a_bad_row_is_one_line_exit_2_and_nothing_is_written(tmp_path, capsys):
    path, data = _config(tmp_path, ROW % (0, 0) + '{"question": "q1"}\n')
    out = tmp_path / "staged.yaml"
    assert main(["stage-data", "--config", str(path), "--out", str(out)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"evosteer stage-data: {data}:2: ") and "answer" in line, line
    assert not out.exists()


def test_a_sim_config_has_nothing_to_stage(tmp_path, capsys):
    assert main(["stage-data", "--run-dir", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "data.source is sim: no benchmark files to stage" in err
    assert load_config(None, {"store.root": str(tmp_path)}).to_yaml() == out
