"""Launching on a cluster: ``pyflyte package`` with no flags yields the workflows and launch
plans of train, evaluate, experiment and replay with the checkout's images, and every remote command of the
README binds to what was packaged (entity, input names, types, required inputs).

``pyflyte package`` only serializes (no cluster, no registry, no network); it runs once, as a
subprocess in a temporary directory with an empty home, so no Flyte config file can supply
images.
"""

import importlib
import os
import re
import shlex
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from flyteidl.admin import launch_plan_pb2, task_pb2, workflow_pb2
from flyteidl.core import types_pb2

import evosteer_core
from evosteer_core.infra.config import config_from_dict, load_config
from evosteer_core.infra.configio import parse_yaml
from evosteer_core.infra.runs import run_id_for
from evosteer_flyte import images
from evosteer_flyte.workflows import launch

ROOT = Path(__file__).resolve().parents[1]
PAPER = ROOT / "configs" / "paper.yaml"
PYFLYTE = Path(sys.executable).with_name("pyflyte")
SIMPLE = types_pb2.SimpleType


@pytest.fixture(scope="module")
def packaged(tmp_path_factory) -> dict:
    """The entities of ``pyflyte package`` (no flags), by kind and name."""
    work = tmp_path_factory.mktemp("package")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLYTE", "EVOSTEER"))}
    env["HOME"] = str(work)
    done = subprocess.run(
        [str(PYFLYTE), "--pkgs", "evosteer_flyte.workflows", "package", "--output", "pkg.tgz"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out: dict = {"task": {}, "workflow": {}, "launch_plan": {}}
    kinds = {
        "1": ("task", task_pb2.TaskSpec),
        "2": ("workflow", workflow_pb2.WorkflowSpec),
        "3": ("launch_plan", launch_plan_pb2.LaunchPlan),
    }
    with tarfile.open(work / "pkg.tgz") as tar:
        for member in tar.getmembers():
            kind, proto = kinds[member.name.rsplit("_", 1)[1].removesuffix(".pb")]
            entity = proto()
            entity.ParseFromString(tar.extractfile(member).read())
            name = entity.id.name if kind == "launch_plan" else entity.template.id.name
            out[kind][name] = entity
    return out


WORKFLOWS = {
    "train": "evosteer_flyte.workflows.launch.train",
    "evaluate": "evosteer_flyte.workflows.launch.evaluate",
    "experiment": "evosteer_flyte.workflows.launch.experiment",
    "replay": "evosteer_flyte.workflows.replay.replay",
}


def _defaults(plan) -> dict:
    """{input: (required, default literal or None)} of a packaged launch plan."""
    return {
        k: (p.required, p.default if p.HasField("default") else None)
        for k, p in plan.spec.default_inputs.parameters.items()
    }


def test_package_without_flags_has_the_four_workflows_and_their_plans(packaged):
    assert set(WORKFLOWS.values()) <= set(packaged["workflow"])
    text, cfg = PAPER.read_text(), load_config(PAPER)
    plans = packaged["launch_plan"]
    for pipeline, workflow_name in WORKFLOWS.items():
        plan = plans[f"paper.{pipeline}"]
        assert plan.spec.workflow_id.name == workflow_name
        defaults = _defaults(plan)
        if pipeline == "replay":
            assert defaults["run_id"][1].scalar.primitive.string_value == run_id_for(cfg)
            assert defaults["store_root"][1].scalar.primitive.string_value == cfg.store.root
            assert defaults["step"][0]  # the one input a replay must be given
        elif pipeline == "experiment":  # paper.yaml has no experiment section: no default
            assert defaults["config_yaml"][0]
        else:
            assert defaults["config_yaml"][1].scalar.primitive.string_value == text
    assert _defaults(plans["paper.train"])["rollout_shards"][1].scalar.primitive.integer == 4
    assert _defaults(plans["paper.evaluate"])["state"][0]


def test_the_weekly_plan_is_scheduled_with_every_input_defaulted(packaged):
    plan = packaged["launch_plan"]["paper.train.weekly"]
    assert plan.spec.entity_metadata.schedule.cron_schedule.schedule == launch.TRAIN_SCHEDULE
    assert not any(required for required, _ in _defaults(plan).values())


def test_every_packaged_task_names_the_checkouts_images(packaged):
    refs = {i.kind: i.reference for i in images.load_images()}
    tag = refs["cpu"].rsplit(":", 1)[1]
    assert re.fullmatch(re.escape(evosteer_core.__version__) + r"-[0-9a-f]{12}", tag)
    used = {t.template.container.image for t in packaged["task"].values()}
    assert used == {refs["cpu"], refs["train_gpu"]}


def _readme_commands() -> list[list[str]]:
    """The ``pyflyte`` commands of the README's cluster section, as argv lists; ``"$(cat F)"``
    becomes the text of F (what the shell would pass)."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Running on a Flyte cluster", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    assert blocks, "no bash block in the README's cluster section"
    commands = []
    for line in "\n".join(blocks).replace("\\\n", " ").splitlines():
        files = re.findall(r'"\$\(cat ([^)]+)\)"', line)
        argv = shlex.split(re.sub(r'"\$\(cat [^)]+\)"', "@FILE@", line), comments=True)
        if argv and argv[0] == "pyflyte":
            commands.append(
                [(ROOT / files.pop(0)).read_text() if a == "@FILE@" else a for a in argv]
            )
    return commands


def _options(args: list[str]) -> dict[str, str]:
    """``--name value`` pairs (every option of these commands takes a value)."""
    assert len(args) % 2 == 0 and all(a.startswith("--") for a in args[::2]), args
    return {k.removeprefix("--"): v for k, v in zip(args[::2], args[1::2], strict=True)}


def _check_value(name: str, literal_type, value: str) -> None:
    """The value converts to the input's type (a config text must be a valid config)."""
    simple = literal_type.simple
    if simple == SIMPLE.INTEGER:
        int(value)
    elif simple == SIMPLE.STRING and name == "config_yaml":
        config_from_dict(parse_yaml(value, "<config_yaml>"), "<config_yaml>")
    else:
        assert simple == SIMPLE.STRING, f"--{name}: the README passes a {simple} input as text"


def _check_run(packaged: dict, argv: list[str]) -> str:
    """``pyflyte run --remote [-p P -d D] FILE ENTITY --input value ...`` against the package:
    the entity is a packaged workflow or launch plan, every option is one of its inputs, every
    required input is given, every value converts. Returns the launched entity's name."""
    rest = argv[2:]
    assert rest.pop(0) == "--remote", argv
    while rest[0] in ("-p", "--project", "-d", "--domain"):
        rest = rest[2:]
    file, entity, *args = rest
    module = importlib.import_module(Path(file).with_suffix("").as_posix().replace("/", "."))
    obj = getattr(module, entity)  # a workflow is launched by its default plan (same name)
    params = dict(packaged["launch_plan"][obj.name].spec.default_inputs.parameters)
    given = _options(args)
    assert set(given) <= set(params), f"{entity}: unknown inputs {set(given) - set(params)}"
    missing = {k for k, p in params.items() if p.required} - set(given)
    assert not missing, f"{entity}: required inputs not given: {missing}"
    for name, value in given.items():
        _check_value(name, params[name].var.type, value)
    return obj.name


def test_the_readmes_remote_commands_bind_to_the_packaged_entities(packaged):
    commands = _readme_commands()
    verbs = [c[1] for c in commands]
    assert {"register", "run", "launchplan"} <= set(verbs), verbs
    launched = set()
    for argv in commands:
        assert "--image" not in argv and "-i" not in argv, argv  # images come from the code
        if argv[1] == "register":
            assert (ROOT / argv[-1]).resolve() == (ROOT / "evosteer_flyte/workflows").resolve()
        elif argv[1] == "run":
            launched.add(_check_run(packaged, argv))
        elif argv[1] == "launchplan":
            assert "--activate" in argv
            assert packaged["launch_plan"][argv[-1]].spec.entity_metadata.schedule.cron_schedule
    assert {"paper.train", WORKFLOWS["train"], "paper.replay"} <= launched


def test_plans_take_their_defaults_from_the_given_config(tmp_path):
    other = tmp_path / "other.yaml"
    other.write_text(
        (ROOT / "configs" / "tiny-sim.yaml").read_text().replace("name: tiny-sim", "name: other")
    )
    plans = launch.launch_plans(other, schedule="*/5 * * * *")
    assert plans["train"].name == "other.train"
    assert plans["train"].saved_inputs["config_yaml"] == other.read_text()
    assert plans["replay"].saved_inputs["run_id"] == run_id_for(load_config(other))
    assert plans["train_weekly"].schedule.cron_schedule.schedule == "*/5 * * * *"
    assert "config_yaml" not in plans["experiment"].saved_inputs  # tiny-sim has no experiment


def test_the_experiment_plan_defaults_to_a_config_with_an_experiment(tmp_path):
    table2 = tmp_path / "table2.yaml"
    rows = "experiment:\n  rows:\n    - {name: AnchorTB}\n    - {name: rho, eval: untrained}\n"
    table2.write_text((ROOT / "configs" / "tiny-sim.yaml").read_text() + rows)
    plans = launch.launch_plans(table2)
    assert plans["experiment"].saved_inputs["config_yaml"] == table2.read_text()


def test_a_missing_launch_config_says_how_to_choose_one(tmp_path):
    with pytest.raises(FileNotFoundError, match=launch.LAUNCH_CONFIG_ENV):
        launch.launch_plans(tmp_path / "absent.yaml")


def test_the_train_workflow_has_a_failure_node_that_ends_its_mlflow_run(packaged):
    """A cluster-side train that fails runs ``fail_tracking`` (the workflow's failure node),
    with the workflow's inputs bound to it and the error. (``pyflyte package`` imports the
    installed checkout; run with ``PYTHONPATH`` set to test another worktree.)"""
    template = packaged["workflow"][WORKFLOWS["train"]].template
    node = template.failure_node
    assert node.task_node.reference_id.name == "evosteer_flyte.tasks.tracking_tasks.fail_tracking"
    bound = {b.var: b.binding.promise.var for b in node.inputs}
    assert bound.pop("err") == ""  # Flyte fills in the error
    assert bound == {k: k for k in ("config_yaml", "steps", "rollout_shards")}
