"""The executor protocol: ``run_node(NodeRequest) -> NodeResult`` and the environment protocol.

Every backend (``openai``, ``sim``) implements :class:`Executor`. A node execution is one
agent turn: possibly several model calls and tool calls within the role's limits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from evosteer_core.episode.records import TaskRecord
from evosteer_core.episode.roles import RoleSpec

STATUSES: tuple[str, ...] = (
    "ok",
    "failed",
    "parse_error",
    "schema_invalid",
    "tool_error",
    "timeout",
    "infra_failure",
    "truncated",
)
"""Node statuses; every status but ``ok`` counts as a failed execution (feature 14)."""


@dataclass(frozen=True)
class SkillView:
    """A skill as a node prompt shows it: id, name and the fully rendered text."""

    skill_id: str
    name: str
    rendered: str


@dataclass(frozen=True)
class Message:
    """An inbound message: the source node's latest output, delivered over an edge."""

    source_id: str
    protocol: str
    text: str
    answer: str | None = None
    evidence: tuple[Evidence, ...] = ()


@dataclass(frozen=True)
class ToolUse:
    """One tool call inside a node execution."""

    tool: str
    query: str
    result: str
    ok: bool


@dataclass(frozen=True)
class Evidence:
    """An evidence record bound to the output version it checked (CollabFlow §2.2).

    ``kind`` is ``exec_check`` (an executable check; weight 2 when passed) or ``retrieval``
    (retrieval support; weight 1). ``subject`` is the answer the check was run on when the
    execution checked a stated candidate (a verifier's check of an input); None: the record
    concerns the execution's own output (docs/collabflow.md §2).
    """

    kind: str
    passed: bool
    detail: str = ""
    subject: str | None = None


@dataclass(frozen=True)
class EnvStep:
    """The outcome of one environment command."""

    observation: str
    ok: bool
    done: bool
    success: bool


@runtime_checkable
class Environment(Protocol):
    """An interactive task environment shared by the nodes of one episode."""

    max_steps: int
    steps_done: int
    done: bool
    success: bool

    def observe(self) -> str: ...

    def step(self, command: str) -> EnvStep: ...

    def phase_fraction(self) -> float: ...


@dataclass(frozen=True)
class CallLimits:
    """What one node execution may spend (already clipped to the episode's remaining budget).

    ``max_input_tokens``/``max_output_tokens`` bound each model call; ``max_total_tokens``
    bounds the sum over all calls of the execution (input + output): the tokens the episode
    has left when the execution starts (None: no episode budget, e.g. the skill author).
    """

    max_model_calls: int
    max_tool_calls: int
    max_input_tokens: int
    max_output_tokens: int
    max_env_steps: int = 0
    max_total_tokens: int | None = None


@dataclass(frozen=True)
class NodeRequest:
    """Everything an executor needs to run one node once.

    ``prompt`` is the full node prompt of docs/method.md §1.1 (built by the runtime); the structured
    fields repeat its parts for backends (the sim) that reason about them directly.
    ``seed_key`` = (run seed, episode key, node id, call index) makes the call deterministic.
    """

    task: TaskRecord
    node_id: str
    role: RoleSpec
    tools: tuple[str, ...]
    skills: tuple[SkillView, ...]
    messages: tuple[Message, ...]
    previous_output: str | None
    prompt: str
    limits: CallLimits
    seed_key: tuple[int, str, str, int]
    environment: Environment | None = None


@dataclass(frozen=True)
class NodeResult:
    """One node execution's outcome. ``answer`` is the extracted answer (None if none stated).
    ``usage_estimated``: the token counts are estimates because the model server reported no
    usage (a note on the accounting, not a failure)."""

    text: str
    answer: str | None
    status: str = "ok"
    failure_kind: str | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    model_calls: int = 0
    tool_calls: int = 0
    latency_s: float = 0.0
    tool_uses: tuple[ToolUse, ...] = ()
    evidence: tuple[Evidence, ...] = field(default=())
    env_steps: int = 0
    env_last_ok: bool | None = None
    usage_estimated: bool = False

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"NodeResult.status {self.status!r} not in {STATUSES}")

    @property
    def failed(self) -> bool:
        return self.status != "ok"


@runtime_checkable
class Executor(Protocol):
    """A backend that runs nodes; ``make_environment`` gives interactive tasks their world."""

    name: str

    def run_node(self, request: NodeRequest) -> NodeResult: ...

    def make_environment(
        self, task: TaskRecord, seed_key: tuple[int, str]
    ) -> Environment | None: ...
