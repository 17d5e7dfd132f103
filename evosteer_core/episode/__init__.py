"""The episode world: actions, graph, budget, runtime, features, roles, records, answers, rollouts."""
