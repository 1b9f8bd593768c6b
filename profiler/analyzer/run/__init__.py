"""The whole run: cross-rank tables, the job's parallel structure, one clock, how it stopped, and how far the traces can be trusted."""
