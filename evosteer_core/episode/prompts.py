"""The prompt an agent node receives when the runtime executes it (docs/method.md §1.1).

The orchestrator's own view of an episode is built and rendered in :mod:`evosteer_core.policy.render`.
"""

from __future__ import annotations

from evosteer_core.episode.records import TaskRecord
from evosteer_core.episode.roles import RoleSpec
from evosteer_core.executors.base import Message, SkillView


def node_prompt(
    role: RoleSpec,
    task: TaskRecord,
    skills: tuple[SkillView, ...],
    messages: tuple[Message, ...],
    previous_output: str | None,
) -> str:
    """A node's prompt in the order of docs/method.md §1.1."""
    parts = [f"Role: {role.role_id}. {role.instruction}", f"Task:\n{task.public_prompt}"]
    parts += [f"Skill:\n{s.rendered}" for s in skills]
    parts += [f"Input from agent {m.source_id} ({m.protocol}): {m.text}" for m in messages]
    if previous_output is not None:
        parts.append(f"Your previous output: {previous_output}")
    parts.append("Perform your role.")
    return "\n\n".join(parts)
