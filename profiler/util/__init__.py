"""Small helpers with no state and no stage of their own, shared by every stage (the ranks included)."""
