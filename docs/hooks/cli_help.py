"""MkDocs hook: each verb's options, as `diagtrain VERB --help` prints them, at build time.

A guide says ``<!-- help: run -->`` where its options belong; the build puts the verb's own help
there, so the options in the docs are always those of the code. An unknown verb fails the build.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from functools import lru_cache

from mkdocs.exceptions import PluginError

MARKER = re.compile(r"<!-- help: (\w+) -->")


@lru_cache(maxsize=None)
def help_text(verb: str) -> str:
    """``diagtrain VERB --help``, at a fixed width so the build does not depend on the terminal."""
    proc = subprocess.run([sys.executable, "-m", "diagtrain.profiler.cli", verb, "--help"], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "COLUMNS": "100"})
    if proc.returncode != 0:
        raise PluginError(f"`diagtrain {verb} --help` exited {proc.returncode}: {proc.stderr[-2000:]}")
    return proc.stdout.rstrip()


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ANN001 - MkDocs' hook signature
    """Replace each help marker with the verb's help in a code block."""
    return MARKER.sub(lambda m: f"```text\n{help_text(m.group(1))}\n```", markdown)
