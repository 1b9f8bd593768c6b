"""Detectors: a module per detector, each a ``detect(tables) -> list[Candidate]`` function proposing the kinds
judge/kinds.py lists for it.

They are registered and run in order in ``judge/judgement.py``, whose assessments weigh their candidates and
whose ``verdict()`` makes the findings; ``base.py`` holds what several detectors share.
"""
