"""Detectors: one module per finding kind, each a ``detect(tables) -> list[Finding]`` function.

They are registered, and run in order with the passes that change their findings, in
``judge/pipeline.py``; ``base.py`` holds what several detectors share.
"""
