"""The run held against the plan's model of its own layout: what the run measured, and the findings where it differs from what the model expects."""
