"""The cost model the planner and the analyzer share: the pipeline bubble of every schedule, model-state
bytes per parameter by precision and ZeRO stage, and the time of a collective.

Pure formulas over plain numbers: the planner (``profiler/plan``) builds layouts and searches them
with these, the analyzer holds a measured run against the same ones. Imports only the shared utilities.
"""
