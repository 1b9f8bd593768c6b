"""Readers: every file a run leaves (traces, logs, flight-recorder dumps, the run directory's own files), read safely into plain records."""
