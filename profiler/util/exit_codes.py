"""Every exit code of the package's command lines (``diagtrain`` verbs, the wrapper, the reference trainers), in
one place: what CI scripts test for."""

EXIT_OK = 0  # the command did what was asked
EXIT_FAILED = 1  # the command could not do its work (e.g. an analysis that could not be written)
EXIT_USAGE = 2  # the command was used wrongly: what argparse returns for a bad argument, so one code for both
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a Ctrl-C
EXIT_REGRESSION = 1  # diagtrain compare: a regression beyond the noise, what CI fails on
EXIT_INCONCLUSIVE = 3  # diagtrain compare: a change the data cannot tell from machine noise
EXIT_HUNG = 124  # diagtrain run: the hang watchdog stopped the job (what `timeout` returns)
EXIT_NOT_FOUND = 127  # diagtrain run: the command was not found (what a shell returns)
