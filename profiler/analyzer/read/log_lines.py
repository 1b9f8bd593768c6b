"""What every text log of a rank shares: launcher prefixes, the line loop, local timestamps.

The NCCL_DEBUG=INFO parser (:mod:`nccl_log`) and the stderr error parser (:mod:`stderr_errors`) read
their lines through here, so a prefix a launcher adds is stripped the same way for both.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from datetime import datetime, timezone

# One prefix per launcher; they can nest (mpirun around torchrun), so stripping repeats.
_LAUNCHER_PREFIX = re.compile(
    r"^(?:"
    r"\[\d+,(?P<mpi>\d+)\]<std(?:out|err)>:"  # Open MPI --tag-output: [jobid,rank]<stdout>:
    r"|\[(?:rank|default)?(?P<bracket>\d+)\]:?"  # torchrun [rank3]: / --tee [default3]: / "[0] "
    r"|\((?:[\w.-]+ )?pid=\d+(?:, ip=[^)]*)?\)"  # Ray: (RayTrainWorker pid=123, ip=10.0.0.1)
    r"|(?P<srun>\d+): "  # srun --label: "3: "
    r")[ \t]?"
)


def strip_launcher_prefix(line: str) -> tuple[str, int | None]:
    """Remove launcher prefixes and the line end; return the text and the rank a prefix named.

    The rank is the innermost prefix's (None for Ray, which names a pid, or when there is none).
    """
    text = line.rstrip("\r\n")
    rank = None
    while match := _LAUNCHER_PREFIX.match(text):
        named = match.group("mpi") or match.group("bracket") or match.group("srun")
        rank = int(named) if named is not None else rank
        text = text[match.end():]
    return text.strip(), rank


def stripped_lines(lines: Iterable[str]) -> Iterator[tuple[int, str, int | None]]:
    """(1-based line number, text without prefixes, launcher rank) for every non-blank line."""
    for line_no, raw in enumerate(lines, start=1):
        text, rank = strip_launcher_prefix(raw)
        if text:
            yield line_no, text, rank


def int_or_text(value: str) -> int | str:
    """Numbers become ints (negative ones too: torch prints -1 for "no work yet")."""
    return int(value) if re.fullmatch(r"-?\d+", value) else value


def local_to_unix(timestamp: str, utc_offset_s: float, year: int) -> float | None:
    """A log line's local time as Unix seconds: NCCL's "2025-03-04 10:22:31" or glog's "0304 10:22:31.5"
    (which has no year: ``year`` is the one the rank started in). None when it does not parse."""
    stamp = timestamp.strip().replace("T", " ").replace(",", ".")
    if re.fullmatch(r"\d{4} .*", stamp):
        stamp = f"{year}-{stamp[:2]}-{stamp[2:4]}{stamp[4:]}"
    day, _, fraction = stamp.partition(".")
    try:
        local = datetime.fromisoformat(day).replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None
    return local - utc_offset_s + (float(f"0.{fraction}") if fraction.isdigit() else 0.0)
