"""Fixed orchestration paradigms (docs/paradigms.md): fixed policies over the orchestrator's
action space, run on the same executor, tools, budget and seeds as the learned orchestrator.

Each paradigm decides from what a real orchestrator sees of a task (its family and public
text, ``base.TaskView``) and, where it says so, from its own nodes' outputs; never from a
record's id, split or gold fields. ``registry`` names them; ``runner`` runs one over rollout
plans; ``searched`` holds the offline workflow search.
"""
