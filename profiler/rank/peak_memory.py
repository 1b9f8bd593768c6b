"""Peak memory: the CUDA caching allocator's peak since start on GPU, this step's peak RSS on CPU.

On GPU the allocator's peak is never reset: ``torch.cuda.reset_peak_memory_stats`` would change what
the job's own ``torch.cuda.max_memory_allocated()`` returns, and the allocator keeps no per-step peak
that can be read without one. The record holds the peak since the process started, or since the job
itself last reset it (``cuda_lifetime_peak``, ``gpu_peak_since: "start"``): a step that raised it
shows as a rise.

On Linux the kernel's peak-RSS counter (VmHWM) can be reset by writing ``5`` to
``/proc/self/clear_refs``, which gives a true per-step peak on CPU. Where that is not allowed the
process-lifetime peak (``ru_maxrss``) is the fallback, and the record says which one it is.
"""

from __future__ import annotations

import resource
from pathlib import Path

import torch

_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")
_RESET_PEAK_RSS = b"5"  # clear_refs code that resets VmHWM (Linux >= 4.0)


class PeakMemory:
    """Reads (and on CPU resets) the peak memory of the current process for one device."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.source = "cuda_lifetime_peak" if device.type == "cuda" else "rss_peak"
        self._can_reset_rss = self.source == "rss_peak" and self._try_reset_rss()
        if self.source == "rss_peak" and not self._can_reset_rss:
            self.source = "rss_lifetime_peak"

    @staticmethod
    def _try_reset_rss() -> bool:
        try:
            _CLEAR_REFS.write_bytes(_RESET_PEAK_RSS)
            return True
        except OSError:
            return False

    def reset(self) -> None:
        """Start a new measurement window (called at the start of each step); never on GPU, see above."""
        if self._can_reset_rss:
            self._try_reset_rss()

    def read(self, cuda_peak: int | None = None) -> int | None:
        """Peak bytes since the last :meth:`reset` (or since start, for the lifetime peaks). On GPU it is
        ``cuda_peak``, the allocator's peak from the step's one read of its statistics (None: not read)."""
        if self.source == "cuda_lifetime_peak":
            return cuda_peak
        if self._can_reset_rss:
            for line in _STATUS.read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
