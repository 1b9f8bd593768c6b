"""The profiler's own chatter in the ranks' output, kept off the user's terminal.

The profiling that diagtrain starts makes torch's C++ side print lines the user did not ask for and
cannot act on: Kineto's ``USDT:... profiler_start`` / ``profiler_stop`` (one per rank per window)
and the CPU allocator's "Memory block of unknown size was allocated before the profiling started"
(once per rank). They stay in each rank's ``stderr.log`` (the rank's own tee wrote them there
before they reach the wrapper) and in the host's ``console.log``; only the terminal is spared.

Ranks write to one pipe at once, so two messages can share a line ("...profiler_stopUSDT:...")
and leave their newlines as blank lines after it: those blank lines go too.
"""

from __future__ import annotations

import re

# Each message is matched whole, so that one glued to another line is cut out of it exactly.
NOISE = re.compile(
    rb"USDT:[^\]\n]*\]\s?profiler_(?:start|stop)"
    rb"|(?:\[rank\d+\]:)?\[W[^\]\n]*CPUAllocator\.cpp:\d+\] Memory block of unknown size was allocated before "
    rb"the profiling started, profiler results will not include the deallocation event"
)


class NoiseFilter:
    """Strips the profiler's messages from one stream's lines; keeps everything else as it came."""

    def __init__(self) -> None:
        self.owed_newlines = 0  # newlines of messages cut from a glued line, still to come as blank lines
        self.dropped = 0  # messages kept off the terminal so far

    def __call__(self, line: bytes) -> bytes | None:
        """``line`` without the profiler's messages, or None when nothing of it is left to show."""
        rest, found = NOISE.subn(b"", line)
        if not found:
            if self.owed_newlines and not line.strip():
                self.owed_newlines -= 1
                return None
            self.owed_newlines = 0  # the job's own output: a blank line of its own is shown
            return line
        self.dropped += found
        if not rest.strip():
            self.owed_newlines += found - 1  # the line's own newline was one of theirs
            return None
        self.owed_newlines += found  # the job's text keeps the line's newline
        return rest
