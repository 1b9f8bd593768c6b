"""Reading a damaged JSON document: one object whose one big array (a trace's ``traceEvents``, a
dump's ``entries``) may hold elements that are not JSON, and which may end early.

The document is walked member by member and the array element by element (``raw_decode``), so a bad
element costs that element only: its text is skipped up to the next element boundary. A document cut
short (a killed writer, a full disk) keeps every element complete before the cut, and says where it
ended. Only the readers' slow paths come here: a clean document is decoded much faster whole.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

_DECODER = json.JSONDecoder()  # NaN and Infinity parse: the readers name them as what is wrong
_WHITESPACE = re.compile(r"\s*")
# Where the next element of an array of objects begins: after a "}" and a ",". A match inside a string
# only resynchronizes onto text that fails to parse, or parses as an element the caller then checks.
_NEXT_OBJECT = re.compile(r"\}\s*,\s*(?=\{)")
_LAST_OBJECT = re.compile(r"\}\s*(?=\])")  # the array's last element ends here


class Unparsed:
    """The stand-in for an element whose text is not JSON."""

    def __repr__(self) -> str:
        return "<not JSON>"


UNPARSED = Unparsed()


@dataclass
class Element:
    """One element of the array: its position, its value (``UNPARSED`` if its text is not JSON), its text."""

    index: int
    value: Any
    text: str


@dataclass
class Cut:
    """Where a document that cannot be read to its end stops."""

    at: int  # characters of text read before it
    where: str  # a JSONPath-like place: "$.traceEvents[1234]", or "after $.traceEvents"
    ended: bool  # the text ended there (cut short); else it is unreadable from there on

    def describe(self) -> str:
        """The cut in words: "ends early in $.traceEvents[1234] (after 56789 characters)"."""
        how = "ends early" if self.ended else "cannot be read past"
        return f"{how} in {self.where} (after {self.at:,} characters)"


@dataclass
class Salvage:
    """A document read as far as it goes: iterate :meth:`elements`, then read ``members`` and ``cut``."""

    text: str
    key: str  # the array's name
    members: list[str] = field(default_factory=list)  # the text of each other member that parsed: '"name": value'
    found: bool = False  # the document is an object holding the array
    cut: Cut | None = None

    def elements(self) -> Iterator[Element]:
        """The array's elements in order; ``members``, ``found`` and ``cut`` are complete once exhausted."""
        text, pos = self.text, _skip(self.text, 0)
        if not text.startswith("{", pos):
            return
        pos += 1
        while (pos := _skip(text, pos)) < len(text) and text[pos] != "}":
            if text[pos] == ",":
                pos += 1
                continue
            end = yield from self._member(pos)
            if end is None:
                return
            pos = end
        if pos >= len(text):
            self.cut = Cut(len(text), self._place(), ended=True)

    def _member(self, pos: int) -> Iterator[Element]:
        """One ``"name": value`` at ``pos``, the array's elements if it is the array; the position after
        it, or None where the document cannot be read further (``cut`` is then set)."""
        text = self.text
        try:
            name, after = _DECODER.raw_decode(text, pos)
            colon = _skip(text, after)
            if not isinstance(name, str) or not text.startswith(":", colon):
                raise json.JSONDecodeError("Expecting a member", text, colon)
            start = _skip(text, colon + 1)
            if name == self.key and text.startswith("[", start):
                self.found = True
                return (yield from self._array(start + 1))
            _, end = _DECODER.raw_decode(text, start)
        except (ValueError, RecursionError) as e:
            self.cut = Cut(pos, self._place(), ended=_ended(e, text))
            return None
        self.members.append(text[pos:end])
        return end

    def _array(self, pos: int) -> Iterator[Element]:
        """The elements from ``pos`` (after the "["); the position after the "]", or None at a cut."""
        text, index = self.text, 0
        while (pos := _skip(text, pos)) < len(text):
            if text[pos] == "]":
                return pos + 1
            if text[pos] == ",":
                pos += 1
                continue
            try:
                value, end = _DECODER.raw_decode(text, pos)
            except (ValueError, RecursionError) as e:
                following = _NEXT_OBJECT.search(text, pos + 1) or _LAST_OBJECT.search(text, pos + 1)
                if following is None:  # the last element: cut short, or garbage to the end
                    self.cut = Cut(pos, f"$.{self.key}[{index}]", ended=_ended(e, text))
                    return None
                value, end = UNPARSED, following.start() + 1
            yield Element(index, value, text[pos:end])
            index, pos = index + 1, end
        self.cut = Cut(len(text), f"$.{self.key}[{index}]", ended=True)
        return None

    def _place(self) -> str:
        return f"after $.{self.key}" if self.found else "the document's keys"

    def header(self) -> str:
        """The document's other members as one JSON object (the array left out)."""
        return "{" + ",".join(self.members) + "}"


def _skip(text: str, pos: int) -> int:
    """The position of the first non-whitespace character at or after ``pos``."""
    return _WHITESPACE.match(text, pos).end()


def _ended(error: BaseException, text: str) -> bool:
    """Whether a parse error is the text running out (a cut), not bad text before its end."""
    if not isinstance(error, json.JSONDecodeError):
        return False
    return error.msg.startswith("Unterminated string") or error.pos >= len(text.rstrip())
