"""Every threshold of the analyzer's judgement, as typed settings: one place to read, change and document them.

A detector (or a pass over findings) declares its thresholds as a frozen dataclass, registered under a
section name, each field with its default and a one-line reason::

    @section("straggler")
    class Straggler:
        min_excess_ms: float = setting(5.0, "below this a rank's extra work is noise on a shared host")

and reads the values in force with ``Straggler.active()`` (or ``active(Straggler)``): the defaults, or
what ``diagtrain analyze --set straggler.min_excess_ms=300`` said. ``describe()`` lists them all for
``diagtrain analyze --settings`` and the documentation, so no page restates a number by hand.
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Iterator, TypeVar

T = TypeVar("T")

# section name -> its settings class, in registration (import) order.
SECTIONS: dict[str, type] = {}
# section -> {name: value} that replace defaults in this analysis (set by `overriding`).
_OVERRIDES: ContextVar[dict[str, dict[str, Any]]] = ContextVar("diagtrain_settings", default={})


class SettingError(ValueError):
    """An override names no setting, or gives it a value of the wrong type."""


def setting(default: Any, reason: str) -> Any:
    """A settings field: its default and the one-line reason for it."""
    return dataclasses.field(default=default, metadata={"reason": reason})


def section(name: str):
    """Register a frozen dataclass of settings under ``name`` (the prefix of ``--set name.field=...``)."""
    def register(cls: type[T]) -> type[T]:
        cls = dataclasses.dataclass(frozen=True)(cls)
        for f in dataclasses.fields(cls):
            if not f.metadata.get("reason"):
                raise TypeError(f"setting {name}.{f.name} has no reason: declare it with setting(default, reason)")
        cls.section = name  # type: ignore[attr-defined]
        cls.active = classmethod(active)  # type: ignore[attr-defined]
        SECTIONS[name] = cls
        return cls
    return register


def active(cls: type[T]) -> T:
    """The settings of ``cls``'s section in force now: defaults, with this analysis' overrides."""
    given = _OVERRIDES.get().get(cls.section, {})  # type: ignore[attr-defined]
    held = _ACTIVE.get(cls)
    if held is None or held[0] != given:  # compared by value: overrides are few, and never trusted not to change
        held = _ACTIVE[cls] = (dict(given), cls(**given))
    return held[1]


# cls -> (the overrides its settings were made with, those settings): asked in loops (a host's contention, 1,024
# times a live judgement at 8,192 ranks), made once per change of overrides. Frozen, so one object serves all.
_ACTIVE: dict[type, tuple[dict[str, Any], Any]] = {}


def values(settings: Any) -> dict[str, Any]:
    """``{"section.name": value}`` of one settings object, as findings and reports record them."""
    return {f"{settings.section}.{k}": v for k, v in dataclasses.asdict(settings).items()}


@contextmanager
def overriding(overrides: dict[str, dict[str, Any]]) -> Iterator[None]:
    """Run the analysis inside with ``overrides`` (from :func:`parse`) in force."""
    token = _OVERRIDES.set(overrides)
    try:
        yield
    finally:
        _OVERRIDES.reset(token)


def parse(assignments: list[str]) -> dict[str, dict[str, Any]]:
    """``["straggler.min_excess_ms=300", ...]`` -> overrides; SettingError names a bad one."""
    out: dict[str, dict[str, Any]] = {}
    for text in assignments:
        key, eq, raw = text.partition("=")
        name, dot, field_name = key.strip().partition(".")
        if not eq or not dot:
            raise SettingError(f"{text!r}: expected SECTION.NAME=VALUE, e.g. straggler.min_excess_ms=300")
        if name not in SECTIONS:
            raise SettingError(f"{key!r}: no section {name!r}; sections: {', '.join(sorted(SECTIONS))}")
        fields = {f.name: f for f in dataclasses.fields(SECTIONS[name])}
        if field_name not in fields:
            raise SettingError(f"{key!r}: {name} has no setting {field_name!r}; its settings: {', '.join(fields)}")
        out.setdefault(name, {})[field_name] = _convert(key, raw.strip(), fields[field_name].default)
    return out


def _convert(key: str, raw: str, default: Any) -> Any:
    kind = type(default)
    try:
        if kind is bool:
            if raw.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError
            return raw.lower() in ("true", "1", "yes")
        if kind is int:
            return int(raw)
        if kind is float:
            value = float(raw)
            if value != value:
                raise ValueError
            return value
        return kind(raw)
    except ValueError:
        raise SettingError(f"{key}={raw!r}: not a valid {kind.__name__} (default {default!r})") from None


def describe() -> list[dict[str, Any]]:
    """Every registered setting: key, type, default and reason; sections by name, fields as declared."""
    return [{"key": f"{name}.{f.name}", "type": type(f.default).__name__, "default": f.default,
             "reason": f.metadata["reason"]}
            for name, cls in sorted(SECTIONS.items()) for f in dataclasses.fields(cls)]


def markdown(rows: list[dict[str, Any]]) -> str:
    """The settings as a Markdown table per section."""
    lines, current = [], None
    for row in rows:
        name = row["key"].partition(".")[0]
        if name != current:
            lines += ([""] if lines else []) + [f"### {name}", "", "| setting | default | why |", "| --- | ---: | --- |"]
            current = name
        lines.append(f"| `{row['key']}` | {row['default']!r} | {row['reason']} |")
    return "\n".join(lines) + "\n"
