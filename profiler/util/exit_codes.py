"""Exit codes every command line of the package shares (``diagtrain`` verbs, the reference trainers).

A verb's own codes (``compare``'s regression and inconclusive) stay with the verb.
"""

EXIT_OK = 0  # the command did what was asked
EXIT_FAILED = 1  # the command could not do its work (e.g. an analysis that could not be written)
EXIT_USAGE = 2  # the command was used wrongly: what argparse returns for a bad argument, so one code for both
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a Ctrl-C
