"""CollabFlow (docs/collabflow.md): a director builds a whole team, a frozen executor runs it
with evidence-gated communication, and Collaborative Trajectory Balance retrains the director."""
