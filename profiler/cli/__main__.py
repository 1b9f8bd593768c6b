"""``python -m diagtrain.profiler.cli``: the same as the ``diagtrain`` console script."""

import sys

from diagtrain.profiler.cli import main

sys.exit(main())
