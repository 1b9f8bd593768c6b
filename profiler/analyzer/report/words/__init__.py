"""Each kind's own words, made from its candidate's facts: a module per proposer, named like it (a detector's
module, model_check for the run against its model, live for live judgement's own kinds, and the assessments that
name a cause no detector did). report/wording.py reads them (``WORDS``) and composes a finding's whole explanation
from its own words and its remarks'.

A module's ``WORDS`` maps a kind, or ``kind/case`` where its proposer says one kind in several ways (the facts'
``"case"``), to its :class:`Words`. Their functions read the finding's facts, with its ``ranks`` and ``steps``.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

Facts = dict[str, Any]


class Words(NamedTuple):
    """A kind's (or case's) explanation and suggestion, each a sentence made from the facts (or a fixed one)."""

    explanation: Callable[[Facts], str] | str
    suggestion: Callable[[Facts], str] | str


def said(text: Callable[[Facts], str] | str, facts: Facts) -> str:
    """One of a :class:`Words`' sentences, for these facts."""
    return text if isinstance(text, str) else text(facts)
