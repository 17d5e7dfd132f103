"""The SIMULATED executor: a seeded generative model of agents over the sim suite.

Each node execution is a pure function of its request: every draw is
``derive_seed(*request.seed_key, purpose...)`` mapped to [0, 1), so the same seed key gives
the same result and a rerun (next call index) draws afresh. Draws are keyed by purpose, not
by order, so two requests that differ only in, say, a bound skill share their draws and
differ only where the skill shifts a probability (common random numbers for paired trials).
The model is described, with every parameter, in docs/sim.md; nothing here is a real model.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass, field

from evosteer_core.benchmarks.metrics import normalize_squad
from evosteer_core.episode.answers import cued_span, stated_answer
from evosteer_core.episode.records import TaskRecord
from evosteer_core.executors.base import (
    CallLimits,
    Environment,
    Evidence,
    Message,
    NodeRequest,
    NodeResult,
    ToolUse,
)
from evosteer_core.infra.seeding import derive_seed
from evosteer_core.sim.environment import SimEnvironment
from evosteer_core.sim.model import DEFAULT_MODEL, FamilyModel, SimModel
from evosteer_core.sim.skills import skill_effect

_UNIT = float(2**63)
PLAN_PREFIX = "Plan:"


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _logit(p: float) -> float:
    p = min(max(p, 1e-6), 1 - 1e-6)
    return math.log(p / (1 - p))


def _game_outcome(body: str, env: SimEnvironment) -> tuple[str, str | None]:
    """An interactive node's text and answer: ``done`` (stated as "Answer: done") once won."""
    if env.success:
        return body + "\nAnswer: done", "done"
    return body, None


@dataclass
class _Work:
    """What a role's behaviour produced in one execution (before token accounting)."""

    body: str
    answer: str | None = None
    model_calls: int = 1
    tool_uses: list[ToolUse] = field(default_factory=list)
    evidence: list[Evidence] = field(default_factory=list)
    env_steps: int = 0
    env_last_ok: bool | None = None


class _Call:
    """One execution's context: the request, its family model and purpose-keyed draws."""

    __slots__ = ("req", "fam", "meta", "gold", "difficulty", "_hash")

    def __init__(self, req: NodeRequest, fam: FamilyModel) -> None:
        self.req = req
        self.fam = fam
        self.meta = req.task.meta
        self.gold = req.task.answers[0] if req.task.answers else ""
        # sha256 state over the text derive_seed hashes for (*seed_key, record_id); each draw
        # copies it and appends its purpose, which equals derive_seed(*key, record, *purpose)
        prefix = "\x1f".join(repr(p) for p in (*req.seed_key, req.task.record_id))
        self._hash = hashlib.sha256(prefix.encode())
        try:
            self.difficulty = float(self.meta["difficulty"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"sim executor: record {req.task.record_id!r} lacks a numeric meta.difficulty "
                "(only sim-suite records can run on the sim executor)"
            ) from exc

    def u(self, *purpose: object) -> float:
        """A uniform draw in [0, 1) keyed by the request's seed key, the record (so that two
        tasks never share draws even under one episode key) and ``purpose``."""
        h = self._hash.copy()
        h.update(("\x1f" + "\x1f".join(repr(p) for p in purpose)).encode())
        return (int.from_bytes(h.digest()[:8], "big") >> 1) / _UNIT

    def is_gold(self, answer: str | None) -> bool:
        return answer is not None and normalize_squad(answer) == normalize_squad(self.gold)


class SimExecutor:
    """Executor backend ``sim``: simulated agents whose success depends on orchestration."""

    name = "sim"

    def __init__(self, model: SimModel = DEFAULT_MODEL) -> None:
        self.model = model

    # --- protocol -------------------------------------------------------------------------
    def make_environment(self, task: TaskRecord, seed_key: tuple[int, str]) -> Environment | None:
        if task.metric != "interactive":
            return None
        return SimEnvironment(task, seed_key, self.model.env_slip)

    def decision_seconds(self, prompt_tokens: int, action_tokens: int) -> float:
        """Simulated time of one orchestrator decision: one model call with this prompt and
        action under the node calls' latency model, so that sim rollouts stay deterministic."""
        m = self.model
        return round(
            m.latency_per_call_s
            + prompt_tokens * m.latency_per_in_token_s
            + action_tokens * m.latency_per_out_token_s,
            6,
        )

    def run_node(self, request: NodeRequest) -> NodeResult:
        family = request.task.family
        fam = self.model.families.get(family)
        if fam is None:
            raise ValueError(f"sim executor: no family model for {family!r}")
        limits = request.limits
        prompt_tokens = math.ceil(len(request.prompt) / self.model.chars_per_token)
        if limits.max_model_calls < 1:
            return NodeResult("", None, status="failed", failure_kind="no_model_calls_left")
        if limits.max_total_tokens is not None and prompt_tokens >= limits.max_total_tokens:
            return NodeResult("", None, status="failed", failure_kind="no_tokens_left")
        if prompt_tokens > limits.max_input_tokens:
            return NodeResult(
                "The prompt exceeds the input limit.",
                None,
                status="failed",
                failure_kind="context_overflow",
                model_calls=1,
                latency_s=self.model.latency_per_call_s,
            )
        call = _Call(request, fam)
        role = request.role.role_id
        if role == "planner":
            work = self._plan(call)
        elif family == "alfworld":
            work = self._act(call)
        elif role == "verifier":
            work = self._verify(call)
        elif role == "finalizer":
            work = self._finalize(call)
        elif role == "tool_user":
            work = self._use_tool(call)
        else:
            work = self._solve(call)
        return self._account(call, work, prompt_tokens)

    # --- shared pieces --------------------------------------------------------------------
    def _competence(self, call: _Call, role: str | None = None) -> float:
        """Logit of a correct own attempt: role competence, difficulty, skills, a rerun's
        self-revision, crowded inputs, and a plan that names the key step."""
        req = call.req
        fam = call.fam
        z = fam.competence.get(role or req.role.role_id, -1.0)
        z -= fam.slope * (call.difficulty - 0.5)
        z += sum(skill_effect(s.name, req.task.family) for s in req.skills)
        if req.previous_output is not None and not req.messages:
            z += fam.self_revision
        z -= self.model.crowding * max(0, len(req.messages) - 2)
        key_step = call.meta.get("key_step")
        if key_step and any(
            m.text.startswith(PLAN_PREFIX) and key_step in m.text for m in req.messages
        ):
            z += fam.plan_bonus
        return z

    def _attempt(self, call: _Call, z: float, tag: str, excluded: tuple[str, ...] = ()) -> str:
        """One own attempt: the gold answer with probability sigmoid(z), else a wrong answer
        (the shared trap with probability meta.trap, else an independent distractor)."""
        if call.u(tag, "correct") < _sigmoid(z) and call.gold not in excluded:
            return call.gold
        trap = call.meta.get("trap_answer")
        if trap and trap not in excluded and call.u(tag, "trap") < float(call.meta["trap"]):
            return trap
        pool = [a for a in call.meta.get("distractors", ()) if a not in excluded]
        if not pool:
            return trap or call.gold
        return pool[int(call.u(tag, "pick") * len(pool))]

    @staticmethod
    def _consensus(messages: tuple[Message, ...]) -> str | None:
        """Evidence-weighted vote over message answers (exec check 2, retrieval 1, plain 1);
        ties go to the latest message."""
        votes: dict[str, float] = {}
        last: dict[str, int] = {}
        for i, m in enumerate(messages):
            if not m.answer:
                continue
            weight = 1.0
            weight += 2.0 * any(e.kind == "exec_check" and e.passed for e in m.evidence)
            weight += 1.0 * any(e.kind == "retrieval" and e.passed for e in m.evidence)
            votes[m.answer] = votes.get(m.answer, 0.0) + weight
            last[m.answer] = i
        if not votes:
            return None
        return max(votes, key=lambda a: (votes[a], last[a]))

    def _tool_budget(self, call: _Call, tool: str, wanted: int) -> int:
        """Tool calls this execution may make: each needs a model call to read its result."""
        lim: CallLimits = call.req.limits
        if tool not in call.req.tools:
            return 0
        return max(0, min(wanted, lim.max_tool_calls, lim.max_model_calls - 1))

    def _tool_failed(self, call: _Call, i: int) -> bool:
        return call.u("tool-failure", i) < self.model.tool_failure

    def _adopt_or_attempt(self, call: _Call, z: float, work: _Work) -> _Work:
        """Take over the inputs' consensus answer (probability ``adopt[role]``) or attempt."""
        role = call.req.role.role_id
        agreed = self._consensus(call.req.messages)
        if agreed is not None and call.u("adopt") < call.fam.adopt.get(role, 0.0):
            work.answer = agreed
            work.body += f"Adopted the answer given by the inputs.\nAnswer: {agreed}"
        else:
            work.answer = self._attempt(call, z, "own")
            work.body += f"Worked through the task step by step.\nAnswer: {work.answer}"
        return work

    # --- roles ------------------------------------------------------------------------------
    def _solve(self, call: _Call) -> _Work:
        """solver and researcher: optional searches (researcher), then adopt or attempt."""
        fam = call.fam
        z = self._competence(call)
        work = _Work(body="")
        n_search = self._tool_budget(call, "search", 3)
        if n_search:
            hit_p = fam.search_hit * (1.0 - call.difficulty / 2)
            found = False
            for i in range(n_search):
                work.model_calls += 1
                if self._tool_failed(call, i):
                    work.tool_uses.append(ToolUse("search", "sim query", "search timed out", False))
                    continue
                found = call.u("search", i) < hit_p
                result = "a passage supports one candidate" if found else "no relevant passage"
                work.tool_uses.append(ToolUse("search", "sim query", result, True))
                if found:
                    break
            if any(t.ok for t in work.tool_uses):
                work.evidence.append(Evidence("retrieval", found, "sim search"))
            if found:
                z += fam.search_bonus
                work.body = "Found a supporting passage. "
        return self._adopt_or_attempt(call, z, work)

    def _finalize(self, call: _Call) -> _Work:
        return self._adopt_or_attempt(call, self._competence(call), _Work(body=""))

    def _judge(self, call: _Call, candidate: str, i: int) -> bool:
        """A verifier's judgement without an executable check: accept or reject."""
        fam = call.fam
        if call.is_gold(candidate):
            reject = fam.false_reject
        elif candidate == call.meta.get("trap_answer"):
            reject = fam.detect_trap
        else:
            reject = fam.detect
        return call.u("judge", i) >= reject

    def _exec_check(self, call: _Call, candidate: str) -> bool:
        """A python check of ``candidate``: deterministic within an episode (same code, same
        verdict), passes correct answers, usually fails wrong ones (the trap less often)."""
        run_seed, episode_key = call.req.seed_key[0], call.req.seed_key[1]
        record = call.req.task.record_id
        u = derive_seed(run_seed, episode_key, record, "exec-check", candidate) / _UNIT
        fam = call.fam
        if call.is_gold(candidate):
            return u >= fam.check_false_fail
        if candidate == call.meta.get("trap_answer"):
            return u >= fam.check_catches_trap
        return u < fam.check_wrong_pass

    def _verify(self, call: _Call) -> _Work:
        """Check inbound answers (and the own previous one) in turn; accept the first that
        passes, else re-solve excluding the rejected ones."""
        req = call.req
        candidates: list[str] = []
        for m in reversed(req.messages):
            if m.answer and m.answer not in candidates:
                candidates.append(m.answer)
        previous = cued_span(req.previous_output or "")
        if previous and previous not in candidates:
            candidates.append(previous)
        work = _Work(body="")
        checks = self._tool_budget(call, "python", 3)
        rejected: list[str] = []
        lines: list[str] = []
        for i, cand in enumerate(candidates):
            if checks > 0:
                checks -= 1
                work.model_calls += 1
                if self._tool_failed(call, len(work.tool_uses)):
                    work.tool_uses.append(
                        ToolUse("python", f"check({cand})", "sandbox error", False)
                    )
                    accept = self._judge(call, cand, i)
                else:
                    accept = self._exec_check(call, cand)
                    verdict = "passed" if accept else "failed"
                    work.tool_uses.append(ToolUse("python", f"check({cand})", verdict, True))
                    work.evidence.append(
                        Evidence("exec_check", accept, f"check of {cand}", subject=cand)
                    )
            else:
                accept = self._judge(call, cand, i)
            lines.append(f"Candidate {cand}: {'accepted' if accept else 'rejected'}.")
            if accept:
                work.answer = cand
                break
            rejected.append(cand)
        if work.answer is None:
            z = self._competence(call) + (self.model.resolve_bonus if rejected else 0.0)
            work.answer = self._attempt(call, z, "resolve", tuple(rejected))
            lines.append("Re-solved the task.")
        work.body = " ".join(lines) + f"\nAnswer: {work.answer}"
        return work

    def _use_tool(self, call: _Call) -> _Work:
        """tool_user: one search or python call whose bare result is the answer when it hits."""
        fam = call.fam
        tool = "search" if "search" in call.req.tools else "python"
        work = _Work(body="")
        hit = False
        if self._tool_budget(call, tool, 1):
            work.model_calls += 1
            if self._tool_failed(call, 0):
                work.tool_uses.append(ToolUse(tool, "sim call", "tool error", False))
            else:
                hit = call.u("tool-hit") < fam.tool_user_hit * (1.0 - call.difficulty / 2)
                work.tool_uses.append(
                    ToolUse(tool, "sim call", "result found" if hit else "-", True)
                )
                if tool == "search":
                    work.evidence.append(Evidence("retrieval", hit, "sim search"))
        work.answer = call.gold if hit else self._attempt(call, self._competence(call), "own")
        work.body = f"Tool result.\nAnswer: {work.answer}"
        return work

    def _plan(self, call: _Call) -> _Work:
        """planner: a plan that names the task's key step with probability plan_quality
        (shifted by bound skills); no answer."""
        fam = call.fam
        skills = sum(skill_effect(s.name, call.req.task.family) for s in call.req.skills)
        good = call.u("plan") < _sigmoid(_logit(fam.plan_quality) + skills)
        key = call.meta.get("key_step", "") if good else "restate what is asked"
        body = f"{PLAN_PREFIX}\n1. Read the task carefully.\n2. {key}.\n3. Derive and state the result."
        return _Work(body=body, answer=None)

    def _act(self, call: _Call) -> _Work:
        """Interactive family: issue commands until the environment is done or the node's
        step allowance (env steps, model calls) is spent."""
        req = call.req
        env = req.environment
        if not isinstance(env, SimEnvironment):
            return _Work(body="No environment to act in.", answer=None, model_calls=1)
        if req.role.role_id == "verifier" and not req.messages:
            body, answer = _game_outcome(
                f"No inputs to check yet. Observation: {env.observe()}", env
            )
            return _Work(body, answer, env_last_ok=None)
        z = self._competence(call)
        if req.messages:
            z += call.fam.context_bonus
        p = _sigmoid(z)
        allowance = min(req.limits.max_env_steps, req.limits.max_model_calls)
        rng = random.Random(derive_seed(*req.seed_key, req.task.record_id, "env-commands"))
        steps, last_ok = 0, None
        n_rec = len(env.receptacles)
        while steps < allowance and not env.done:
            right, kind, where = rng.random(), rng.random(), rng.random()
            if right < p:
                cmd = env.next_command()
            elif kind < self.model.env_regress:
                cmd = f"put {env.obj} 1 in/on {env.receptacles[int(where * n_rec)]}"
            elif kind < self.model.env_regress + self.model.env_invalid:
                cmd = f"open {env.obj} 1"
            else:
                cmd = f"go to {env.receptacles[int(where * n_rec)]}"
            last_ok = env.step(cmd).ok
            steps += 1
        body, answer = _game_outcome(
            f"Took {steps} actions. Last observation: {env.observe()}", env
        )
        return _Work(body, answer, model_calls=max(1, steps), env_steps=steps, env_last_ok=last_ok)

    # --- accounting -------------------------------------------------------------------------
    def _account(self, call: _Call, work: _Work, prompt_tokens: int) -> NodeResult:
        """Tokens, status and simulated latency of one execution, within its limits."""
        m = self.model
        lim = call.req.limits
        role = call.req.role.role_id
        calls = min(work.model_calls, lim.max_model_calls)
        if work.env_steps:
            mean_out = m.step_out_tokens * work.env_steps
            growth = m.step_obs_tokens
        else:
            mean_out = m.out_tokens.get(role, 200.0) * call.fam.out_tokens * calls
            growth = m.tool_result_tokens
        tokens_in = calls * prompt_tokens + growth * calls * (calls - 1) // 2
        tokens_out = max(1, round(mean_out * (0.5 + call.u("out-tokens"))))
        status, failure, text = "ok", None, work.body
        cap_out = lim.max_output_tokens * calls
        mishap = call.u("mishap")  # one draw decides rambling (first) or a garbled answer line
        if tokens_out > cap_out or mishap < m.ramble:
            # the last call ran to its output limit: the answer line was never written
            status, failure = "truncated", "output_token_limit"
            tokens_out = min(cap_out, tokens_out * (calls - 1) // calls + lim.max_output_tokens)
        room = lim.max_total_tokens
        if room is not None and tokens_in + tokens_out > room:
            # the episode's tokens ran out during the execution: it stops there, unanswered
            status, failure = "truncated", "token_budget"
            tokens_in = min(tokens_in, room - 1)
            tokens_out = room - tokens_in
        if status == "truncated":
            text = work.body.split("\nAnswer:")[0][: max(20, len(work.body) // 2)]
        elif work.answer is not None and mishap < m.ramble + m.parse_error:
            status, failure = "parse_error", "no_parsable_answer"
            text = work.body.split("\nAnswer:")[0] + "\n(the answer line is garbled)"
        elif work.tool_uses and not any(t.ok for t in work.tool_uses):
            status, failure = "tool_error", "every_tool_call_failed"
        latency = (
            calls * m.latency_per_call_s
            + tokens_out * m.latency_per_out_token_s
            + tokens_in * m.latency_per_in_token_s
            + sum(m.latency_per_tool_s.get(t.tool, 0.5) for t in work.tool_uses)
            + work.env_steps * m.latency_per_env_step_s
        )
        return NodeResult(
            text=text,
            answer=stated_answer(text, call.req.role, call.req.task, status),
            status=status,
            failure_kind=failure,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            model_calls=calls,
            tool_calls=len(work.tool_uses),
            latency_s=round(latency, 6),
            tool_uses=tuple(work.tool_uses),
            evidence=tuple(work.evidence),
            env_steps=work.env_steps,
            env_last_ok=work.env_last_ok,
        )
