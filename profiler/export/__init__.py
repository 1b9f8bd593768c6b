"""Writing a run for other tools: one trace of every rank for Perfetto."""
