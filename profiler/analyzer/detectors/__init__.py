"""Detectors: one module each, from the analysis tables to findings."""
