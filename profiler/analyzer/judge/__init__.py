"""Judgement: detectors and every pass that changes findings, in the order they run (see ``judge``)."""
