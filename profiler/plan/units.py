"""Quantities as people write them on a command line ("70B", "80GB", "400Gb/s") and as reports print them."""

from __future__ import annotations

import re

# Decimal prefixes, as model sizes ("7B"), vendor memory ("80 GB") and link speeds ("400 Gb/s") use them.
PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "b": 1e9, "t": 1e12, "p": 1e15}
BINARY = {"ki": 2.0**10, "mi": 2.0**20, "gi": 2.0**30, "ti": 2.0**40}
_NUMBER = r"(?P<n>[0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)"
_COUNT = re.compile(_NUMBER + r"\s*(?P<p>[kmgbtp]?)$", re.IGNORECASE)
_BYTES = re.compile(_NUMBER + r"\s*(?P<p>[kmgtp]i?|)(?P<u>b)?$", re.IGNORECASE)
_RATE = re.compile(_NUMBER + r"\s*(?P<p>[kmgtpKMGTP]?)(?P<u>B|b|bit|bits)(?:/s|ps)$")


def parse_count(text: str) -> float:
    """``70B``, ``1.3b``, ``350M``, ``7e9`` → a positive number (B and G both mean 10^9)."""
    m = _COUNT.match(text.strip())
    if not m or float(m["n"]) <= 0:
        raise ValueError(f"{text!r}: expected a positive count such as 70B, 350M or 7e9")
    return float(m["n"]) * PREFIX[m["p"].lower()]


def parse_bytes(text: str) -> float:
    """``80GB`` (10^9), ``80GiB`` (2^30), ``512MB`` → bytes."""
    m = _BYTES.match(text.strip())
    if not m or float(m["n"]) <= 0:
        raise ValueError(f"{text!r}: expected a positive size such as 80GB or 96GiB")
    prefix = m["p"].lower()
    return float(m["n"]) * (BINARY[prefix] if prefix in BINARY else PREFIX[prefix])


def parse_bandwidth(text: str) -> float:
    """``900GB/s`` (bytes) or ``400Gb/s`` / ``400Gbps`` (bits) → bytes per second."""
    m = _RATE.match(text.strip())
    if not m or float(m["n"]) <= 0:
        raise ValueError(f"{text!r}: expected a positive bandwidth such as 900GB/s or 400Gb/s "
                         "(B = bytes, b = bits)")
    value = float(m["n"]) * PREFIX[m["p"].lower()]
    return value if m["u"] == "B" else value / 8


def fmt_count(n: float) -> str:
    """232576 → '232.6K'; 7e10 → '70B'."""
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:.4g}{suffix}"
    return f"{n:.4g}"


def fmt_seconds(s: float) -> str:
    """0.0817 → '81.7 ms'; 2.5e-5 → '25 µs'; 12.3 → '12.3 s'."""
    if abs(s) >= 1:
        return f"{s:.3g} s"
    if abs(s) >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} µs"


def fmt_rate(bytes_per_s: float) -> str:
    """Bytes per second in GB/s (decimal, as link speeds are quoted)."""
    return f"{bytes_per_s / 1e9:.3g} GB/s"
