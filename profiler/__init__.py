"""diagtrain's toolkit core: CLI, in-rank instrumentation and the run directory.

Importing this package does not import torch; the modules that need it import it themselves.
"""
