"""The analyzer: run directory (or a folder of traces) → tables → detectors → findings → report."""
