"""One rank's tables: a rank's traces and records turned into steps, collectives, segments and spans (in worker processes)."""
