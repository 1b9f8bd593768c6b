"""MkDocs hook: the findings reference's settings tables, generated from `diagtrain analyze --settings`.

A page asks for the tables of some sections with ``<!-- settings: straggler own_time -->``; the page
that says ``<!-- settings: unclaimed -->`` gets every section no other page asked for. The tables
are the analyzer's own Markdown (``--settings md``), so no threshold is ever typed into the docs by
hand, and a new setting shows up in the next build. A marker naming a section the analyzer does not
have, a section asked for twice, or a section no page shows fails the build.
"""

from __future__ import annotations

import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

from mkdocs.exceptions import PluginError

MARKER = re.compile(r"<!-- settings: ([\w ]+) -->")
UNCLAIMED = "unclaimed"


@lru_cache(maxsize=1)
def settings_tables() -> dict[str, str]:
    """Section name -> its Markdown table, as ``diagtrain analyze --settings md`` prints it."""
    proc = subprocess.run([sys.executable, "-m", "diagtrain.profiler.cli", "analyze", "--settings", "md"],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise PluginError(f"`diagtrain analyze --settings md` exited {proc.returncode}: {proc.stderr[-2000:]}")
    tables = {}
    for block in re.split(r"^### ", proc.stdout, flags=re.M)[1:]:
        name, _, table = block.partition("\n")
        tables[name.strip()] = table.strip()
    return tables


def claims(docs_dir: Path) -> dict[str, str]:
    """Section (or ``unclaimed``) -> the page (relative path) whose marker asks for it; fails on a section
    asked for twice and when no page takes the unclaimed ones."""
    owner: dict[str, str] = {}
    for page in sorted(docs_dir.rglob("*.md")):
        for match in MARKER.finditer(page.read_text()):
            for name in match.group(1).split():
                where = str(page.relative_to(docs_dir))
                if name in owner:
                    raise PluginError(f"settings section {name!r} is asked for by {owner[name]} and {where}")
                owner[name] = where
    if UNCLAIMED not in owner:
        raise PluginError(f"no page has `<!-- settings: {UNCLAIMED} -->`: some settings would be documented nowhere")
    return owner


_OWNER: dict[str, str] = {}  # this build's claims, from on_config


def on_config(config):  # noqa: ANN001, ANN201 - MkDocs' hook signature
    """Check the markers against the analyzer before any page is built."""
    tables, owner = settings_tables(), claims(Path(config["docs_dir"]))
    unknown = sorted(set(owner) - set(tables) - {UNCLAIMED})
    if unknown:
        raise PluginError(f"settings sections not in `diagtrain analyze --settings`: {unknown} "
                          f"(asked for by {sorted({owner[n] for n in unknown})})")
    _OWNER.clear()
    _OWNER.update(owner)
    return config


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ANN001 - MkDocs' hook signature
    """Replace each settings marker with its tables."""
    tables = settings_tables()

    def render(match: re.Match) -> str:
        names = match.group(1).split()
        if names == [UNCLAIMED]:
            names = [n for n in tables if n not in _OWNER]
        return "\n\n".join(f"### `{name}`\n\n{tables[name]}" for name in names)

    return MARKER.sub(render, markdown)
