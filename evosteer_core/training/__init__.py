"""Training: the session, the stages of one step, the actor update and the loop."""
