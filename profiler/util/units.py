"""Byte counts as reports print them, in binary units as allocators and NCCL count memory."""

from __future__ import annotations

MIB = 2**20  # bytes in a MiB: the unit memory is charted and tabled in


def fmt_bytes(n: float) -> str:
    """Binary units, as memory is reported by allocators: 1.5 GiB, 930 KiB."""
    for div, suffix in ((2.0**40, "TiB"), (2.0**30, "GiB"), (2.0**20, "MiB"), (2.0**10, "KiB")):
        if abs(n) >= div:
            return f"{n / div:.3g} {suffix}"
    return f"{n:.0f} B"


def mib_text(n: float | None) -> str:
    """A byte count as a table's MiB column shows it (``1536.0``; '' when unknown)."""
    return "" if n is None else f"{n / MIB:.1f}"
