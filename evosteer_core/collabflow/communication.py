"""Evidence-gated communication over a team's edges: the fixed sweep order, the protocols'
edge programs and the per-gate log (docs/collabflow.md §2, docs/method.md §2.2).

FinalOnly edges run no gate (their result is made available to the receiver's local
episode, :mod:`evosteer_core.collabflow.execution`); OneWay runs one gate; Interactive runs at
most ``r_max`` gates in alternating directions, starting source → target, and stops at
agreement or a decisive adopt/keep. The sweep visits the edges once in a fixed order
(topological, lexicographic ties); a cyclic team is swept at most ``r_comm`` times.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, MutableMapping, Sequence
from dataclasses import asdict, dataclass

from evosteer_core.collabflow.evidence import BRANCHES, Candidate, Holding, gate
from evosteer_core.collabflow.team import Team, TeamEdge
from evosteer_core.executors.base import Message


class BudgetExhausted(Exception):
    """The execution budget cannot pay for the next call: the schedule stops there and the
    team keeps its current candidates (the declared current-output rule)."""


AgentReviser = Callable[[str, Holding, Holding, str], "Holding | None"]
"""``revise(receiver_agent, receiver, sender, protocol)``: one bounded, tool-free call of the
receiving agent; the new holding, None when the call failed, or :class:`BudgetExhausted`."""


def agent_order(team: Team) -> list[str]:
    """The fixed agent order: topological with lexicographic ties (the smallest id among the
    agents no remaining agent sends to comes next); on a cycle, the smallest remaining id."""
    remaining = set(team.agents)
    order: list[str] = []
    while remaining:
        ready = [
            a
            for a in remaining
            if not any(e.target == a and e.source in remaining and e.source != a for e in team.edges)
        ]
        nxt = min(ready) if ready else min(remaining)
        order.append(nxt)
        remaining.remove(nxt)
    return order


def edge_order(team: Team) -> list[TeamEdge]:
    """Edges by (source position, target position) in :func:`agent_order`."""
    pos = {a: i for i, a in enumerate(agent_order(team))}
    return sorted(team.edges, key=lambda e: (pos[e.source], pos[e.target], e.protocol))


def is_cyclic(team: Team) -> bool:
    """Whether some edge points backwards in the agent order (the team has a directed cycle)."""
    pos = {a: i for i, a in enumerate(agent_order(team))}
    return any(pos[e.source] > pos[e.target] for e in team.edges)


def message_of(source: str, protocol: str, holding: Holding) -> Message:
    """A holding as a message: its text, answer and evidence, with the evidence also written
    out (a revision's context may hold the peer's evidence)."""
    ev = tuple(r.evidence for r in holding.evidence)
    lines = [f"{e.kind} {'passed' if e.passed else 'failed'}" for e in ev]
    text = holding.candidate.text + (f"\nEvidence: {'; '.join(lines)}" if lines else "")
    return Message(source, protocol, text, holding.candidate.answer, ev)


@dataclass(frozen=True)
class GateRow:
    """One elementary gate evaluation, as the per-gate log's row (docs/collabflow.md §2)."""

    sweep: int
    source: str
    target: str
    protocol: str
    round: int
    sender: str
    receiver: str
    branch: str
    delta: int
    revised: bool
    sender_answer: str | None
    before_answer: str | None
    after_answer: str | None
    sender_correct: bool
    before_correct: bool
    after_correct: bool

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class CommunicationResult:
    """The holdings after the sweep, the gate log and why the schedule stopped early
    (None: it ran to the end)."""

    holdings: dict[str, Holding]
    gates: tuple[GateRow, ...]
    sweeps: int
    stopped: str | None = None


def communicate(
    team: Team,
    holdings: MutableMapping[str, Holding],
    revise: AgentReviser,
    correct: Callable[[Candidate], bool],
    *,
    kappa: float,
    r_max: int,
    r_comm: int,
    rule: str = "evidence",
) -> CommunicationResult:
    """Run every edge program once per sweep in :func:`edge_order` (one sweep for an acyclic
    team, at most ``r_comm`` for a cyclic one, ending early after a sweep that changed no
    holding). Every update sees the holdings the previous ones left."""
    state = dict(holdings)
    rows: list[GateRow] = []
    sweeps = 1 if not is_cyclic(team) else r_comm
    done = 0
    try:
        for sweep in range(1, sweeps + 1):
            before = dict(state)
            for edge in edge_order(team):
                rows += _edge_program(edge, sweep, state, revise, correct, kappa, r_max, rule)
            done = sweep
            if state == before:
                break
    except BudgetExhausted:
        return CommunicationResult(state, tuple(rows), done + 1, stopped="execution budget exhausted")
    return CommunicationResult(state, tuple(rows), done)


def _edge_program(
    edge: TeamEdge,
    sweep: int,
    state: MutableMapping[str, Holding],
    revise: AgentReviser,
    correct: Callable[[Candidate], bool],
    kappa: float,
    r_max: int,
    rule: str,
) -> list[GateRow]:
    """The gates one visit of ``edge`` runs: none (final_only), one (one_way), or up to
    ``r_max`` alternating ones (interactive) until a branch other than revise."""
    rounds = {"final_only": 0, "one_way": 1, "interactive": r_max}[edge.protocol]
    sender, receiver = edge.source, edge.target
    rows = []
    for rnd in range(1, rounds + 1):
        s, r = state[sender], state[receiver]
        result = gate(
            s,
            r,
            kappa,
            lambda rec, sen, agent=receiver: revise(agent, rec, sen, edge.protocol),
            rule,
        )
        state[receiver] = result.after
        rows.append(
            GateRow(
                sweep=sweep,
                source=edge.source,
                target=edge.target,
                protocol=edge.protocol,
                round=rnd,
                sender=sender,
                receiver=receiver,
                branch=result.branch,
                delta=result.delta,
                revised=result.revised,
                sender_answer=s.candidate.answer,
                before_answer=r.candidate.answer,
                after_answer=result.after.candidate.answer,
                sender_correct=correct(s.candidate),
                before_correct=correct(r.candidate),
                after_correct=correct(result.after.candidate),
            )
        )
        if result.branch != "revise":
            break
        sender, receiver = receiver, sender
    return rows


def gate_summary(rows: Iterable[GateRow]) -> dict[str, float | int]:
    """Counts per branch and the harm/help rates of docs/collabflow.md §2 (paper Eq. 9):
    on C (receiver correct, sender wrong) the false-adoption rate δ_C = P(adopt | C) and the
    revision error c_J = P(wrong after | revise, C); on C' (receiver wrong, sender right) the
    true-adoption rate δ⁺ and the revision's correction rate c⁺_J; ``flip_rate`` =
    P(wrong after | C). Rates over an empty event are NaN."""
    rows = list(rows)
    out: dict[str, float | int] = {"gates": len(rows)}
    for b in BRANCHES:
        out[b] = sum(r.branch == b for r in rows)
    harm = [r for r in rows if r.before_correct and not r.sender_correct]
    help_ = [r for r in rows if not r.before_correct and r.sender_correct]
    out["C"], out["C_prime"] = len(harm), len(help_)
    out["false_adoption"] = _rate(r.branch == "adopt" for r in harm)
    out["revision_error"] = _rate(not r.after_correct for r in harm if r.branch == "revise")
    out["flip_rate"] = _rate(not r.after_correct for r in harm)
    out["true_adoption"] = _rate(r.branch == "adopt" for r in help_)
    out["revision_correction"] = _rate(r.after_correct for r in help_ if r.branch == "revise")
    return out


def _rate(flags: Iterable[bool]) -> float:
    flags = list(flags)
    return sum(flags) / len(flags) if flags else float("nan")


def gate_table(rows: Sequence[GateRow]) -> list[dict[str, object]]:
    """The gate log as table rows (one dict per gate, the columns of :class:`GateRow`)."""
    return [r.to_dict() for r in rows]
