"""What each event of a PyTorch Profiler (Kineto) trace is, in every dialect: device work (compute,
communication, memory, waits), host work, markers, or unknown.

Device work is recognized by its category (libkineto's ActivityType names, in any era's spelling),
never by a stream argument alone; its kind by its name, as Holistic Trace Analysis does. Where the
result departs from HTA's on purpose, and for every category nobody here knows, the reader gets a
note ({check, severity, message}) that the report's trace health section shows.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from diagtrain.profiler.util.frames import code_dtype, set_column

# What each Kineto event category is (libkineto's ActivityType names). Compared lower-case: traces
# written before late 2021 spell four of them "Kernel", "Runtime", "Memcpy" and "Memset".
DEVICE_CATEGORIES = frozenset({
    "kernel", "gpu_memcpy", "gpu_memset",  # CUDA and ROCm
    "mtia_ccp_events",  # MTIA: kernels, DMA and stream waits on the device
    "cuda_sync", "xpu_sync",  # a stream waiting on an event or on the host: busy, not compute
    "collective_comm",  # XPU: collectives recorded on the device
})
# CUPTI range profiler (and XPU's scope profiler): hardware counters of kernels replayed to collect
# them. They say which kernels ran, not when or for how long (their timestamps are the replays').
DEVICE_RANGE_CATEGORIES = frozenset({"cuda_profiler_range", "xpu_scope_profiler"})
HOST_CATEGORIES = frozenset({
    "cpu_op", "user_annotation", "python_function", "cpu_instant_event", "external_correlation", "overhead", "trace",
    "cuda_runtime", "cuda_driver", "mtia_runtime", "glow_runtime", "hpu_op", "xpu_runtime", "xpu_driver",
    "privateuse1_runtime", "privateuse1_driver",
})
# Known, and neither host work nor device work of their own: a device-side annotation spans kernels
# that are counted already, a cudaEventRecord is a 1 µs marker, counters are samples.
MARKER_CATEGORIES = frozenset({"gpu_user_annotation", "cuda_event", "hardware_counters", "mtia_counters"})
OLD_SPELLINGS = {"runtime": "cuda_runtime", "memcpy": "gpu_memcpy", "memset": "gpu_memset"}  # "Kernel" is "kernel"
FIXED_KINDS = {"gpu_memcpy": "memory", "gpu_memset": "memory", "cuda_sync": "sync", "xpu_sync": "sync",
               "collective_comm": "comm"}  # device categories whose kind does not depend on the name
# A sync without a stream is the host waiting for the whole device or an event (cudaDeviceSynchronize,
# cudaEventSynchronize): the device's own work is counted already, so it is no device time (nor in HTA).
STREAM_ONLY_CATEGORIES = frozenset({"cuda_sync", "xpu_sync"})

# Communication on every backend: NCCL/RCCL kernels, and the host-side ops of c10d and gloo.
COMM_KERNEL = re.compile(r"^(nccl|rccl)", re.IGNORECASE)
COMM_HOST_OP = re.compile(r"^(gloo:|nccl:|c10d::|record_param_comms$)")
MEMORY_KERNEL = re.compile(r"^(Memcpy|Memset|dma)|Memcpy")  # HTA's memory kernels, and its copies named *Memcpy*
# A device stream waiting (on an event, another stream or the host) is busy but computes nothing.
# HTA's rule is any name with "Sync"; MTIA's event_wait / event_record and CUDA's Stream Wait Event
# are the same thing under other names (HTA counts those as compute: see HTA_NOT_COMPUTE).
SYNC_KERNEL = re.compile(r"Sync|^(Stream Wait Event|event_wait|event_record)$")
# HTA 0.5's kernel types: communication, then memory, then compute unless the name says otherwise.
HTA_NOT_COMPUTE = (re.compile(r"^nccl.*Kernel"), re.compile(r"(^Memcpy)|(^Memset)|(^dma)"),
                   re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)"))
STEP_ANNOTATION = re.compile(r"^ProfilerStep\s*#\s*(\d+)$")
# torch.utils.data's own profiler spans around fetching a batch (the main thread's wait for it).
DATALOADER_SPAN = re.compile(r"^enumerate\(DataLoader\)#.*__next__$")
# c10d's point-to-point calls (communication host ops); their concrete inputs are (tensors, group,
# peer in the group, tag).
P2P_CALL = re.compile(r"^c10d::(send|recv_|recv_any_source_)$")
COMPUTE, COMM, MEMORY, SYNC, CPU, MARKER, UNCLASSIFIED = "compute", "comm", "memory", "sync", "cpu", "marker", "unclassified"
KINDS = [COMM, MEMORY, COMPUTE, SYNC, CPU, MARKER, UNCLASSIFIED]
# Device work without a stream (MTIA DMA on a hardware queue) gets a lane of its own.
STREAMLESS_LANE = 2**31 - 1


_DEVICE, _RANGE, _HOST, _MARKER, _UNKNOWN = range(5)  # what an event category is
_CODE = {kind: code for code, kind in enumerate(KINDS)}


def classify(frame: pd.DataFrame, stream_arg: np.ndarray) -> tuple[list[dict[str, str]], int]:
    """Set each event's ``kind`` and device lane (``stream``, -1 on the host; ``stream_arg`` becomes it)
    from what its category says it is, never from a stream argument alone; return the notes on what
    was not classified or is counted unlike HTA, and how many range-profiler ranges there were."""
    cat_codes, categories = _canonical_categories(frame)
    per_category = np.array([(_role(c), _CODE.get(FIXED_KINDS.get(c), -1), c in STREAM_ONLY_CATEGORIES)
                             for c in categories] + [(_UNKNOWN, -1, False)], dtype=np.int8)
    role, fixed, stream_only = (per_category[:, i][cat_codes] for i in range(3))
    names = frame["name"]
    has_stream = stream_arg >= 0
    device = (role == _DEVICE) & (has_stream | (stream_only == 0))
    # Per distinct name, then per event by its code: one byte an event, not a temporary per rule.
    per_name = np.select([_name_hits(names, COMM_KERNEL), _name_hits(names, MEMORY_KERNEL, search=True),
                          _name_hits(names, SYNC_KERNEL, search=True)],
                         [_CODE[COMM], _CODE[MEMORY], _CODE[SYNC]], default=_CODE[COMPUTE]).astype(np.int8)
    name_kind = _per_event(names, per_name, _CODE[COMPUTE])
    comm_host = _per_event(names, _name_hits(names, COMM_HOST_OP), False)
    kind = np.select([device & (fixed >= 0), device, role == _UNKNOWN, role != _HOST, comm_host],
                     [fixed, name_kind, _CODE[UNCLASSIFIED], _CODE[MARKER], _CODE[COMM]], default=_CODE[CPU])
    # The lanes written over the stream arguments (the caller's array, let go after): two nested
    # np.where made two temporaries of every event's lane, 128 MiB at 16M events.
    np.putmask(stream_arg, ~has_stream, STREAMLESS_LANE)
    np.putmask(stream_arg, ~device, -1)
    set_column(frame, "stream", stream_arg)
    frame["kind"] = pd.Categorical.from_codes(kind, categories=KINDS)
    notes = _unclassified_notes(frame, cat_codes, role == _UNKNOWN, has_stream)
    notes += _hta_departures(frame, kind, device, has_stream)
    ranges = int((role == _RANGE).sum())
    if ranges:
        timed = "no device time breakdown can be made from this trace" if not device.any() else "left out of device time"
        notes.append(_note("device_time_unknown" if not device.any() else "not_device_work",
                           "warning" if not device.any() else "info",
                           f"device work seen only by the CUPTI range profiler: {_describe(frame, role == _RANGE)}; "
                           f"these are hardware counters of kernels replayed to collect them, timed by the replays, "
                           f"not the kernels: {timed}"))
    return notes, ranges


def _canonical_categories(frame: pd.DataFrame) -> tuple[np.ndarray, list[str]]:
    """Known categories in Kineto's current lower-case spelling (the trace's own spelling for unknown
    ones); the ``cat`` column rewritten so, and its codes (-1 for none)."""
    cats = frame["cat"].cat
    canonical = [_canonical(c) for c in cats.categories]
    unique = list(dict.fromkeys(canonical))
    remap = np.array([unique.index(c) for c in canonical] + [-1], dtype=code_dtype(len(unique)))
    codes = remap[cats.codes.to_numpy()]
    frame["cat"] = pd.Categorical.from_codes(codes, categories=unique) if unique else frame["cat"]
    return codes, unique


def _canonical(category: str) -> str:
    lower = OLD_SPELLINGS.get(category.lower(), category.lower())
    return lower if _role(lower) != _UNKNOWN else category


def _role(category: str) -> int:
    if category in DEVICE_CATEGORIES:
        return _DEVICE
    if category in DEVICE_RANGE_CATEGORIES:
        return _RANGE
    if category in HOST_CATEGORIES:
        return _HOST
    return _MARKER if category in MARKER_CATEGORIES else _UNKNOWN


def _unclassified_notes(frame: pd.DataFrame, cat_codes: np.ndarray, unknown: np.ndarray,
                        has_stream: np.ndarray) -> list[dict[str, str]]:
    """One warning per category the analyzer does not know: it is counted in no number."""
    notes = []
    categories = list(frame["cat"].cat.categories)
    for code in sorted(set(cat_codes[unknown].tolist()), key=lambda c: str(categories[c]) if c >= 0 else ""):
        mask = unknown & (cat_codes == code)
        category = categories[code] if code >= 0 else ""
        hta = " (HTA counts those with a stream argument as device time)" if (mask & has_stream).any() else ""
        label = f"category {category!r}" if category else "events without a category"
        notes.append(_note("unclassified", "warning", f"{label} is not classified: {_describe(frame, mask)}, "
                           f"counted in no number{hta}"))
    return notes


def _hta_departures(frame: pd.DataFrame, kind: np.ndarray, device: np.ndarray,
                    has_stream: np.ndarray) -> list[dict[str, str]]:
    """Where these events count unlike in HTA 0.5, which takes any event with a stream argument for a
    kernel and any kernel name without "Sync", "Memcpy", "Memset" or "nccl...Kernel" for compute."""
    known = kind != _CODE[UNCLASSIFIED]
    names = frame["name"]
    hta_compute = has_stream & ~_per_event(names, np.logical_or.reduce([_name_hits(names, p) for p in HTA_NOT_COMPUTE]),
                                           False)
    ours_compute = kind == _CODE[COMPUTE]
    notes = []

    def departs(mask: np.ndarray, what: str, how: str) -> None:
        if mask.any():
            notes.append(_note("departs_from_hta", "info", f"{what}: {_describe(frame, mask)}; {how}"))

    departs(known & ~device & has_stream, "host events with a stream argument (Triton and torch.compile launches)",
            "host time here, device time in HTA")
    departs(device & ~has_stream, "device work without a stream (e.g. DMA on a hardware queue)",
            "device time here, left out by HTA")
    both = device & has_stream
    for ours in (SYNC, COMM, MEMORY):
        departs(both & hta_compute & (kind == _CODE[ours]), _KIND_WORDS[ours], "non-compute here, compute in HTA")
    departs(both & ~hta_compute & ours_compute, "device work", "compute here, non-compute in HTA")
    return notes


_KIND_WORDS = {SYNC: "device waits (a stream waiting for an event or another stream)",
               COMM: "device communication", MEMORY: "device memory transfers"}
_NAMES_SHOWN = 3  # the most frequent names in a note; the rest are counted


def _describe(frame: pd.DataFrame, mask: np.ndarray) -> str:
    """'3 events (12.0 µs: Stream Wait Event ×2, …)' for the events in ``mask``."""
    rows = frame.loc[mask, ["name", "dur"]]
    counts = rows["name"].astype(str).value_counts()
    shown = ", ".join(f"{_short(name)} ×{count}" for name, count in counts.head(_NAMES_SHOWN).items())
    more = f", {len(counts) - _NAMES_SHOWN} more names" if len(counts) > _NAMES_SHOWN else ""
    count = int(mask.sum())
    return f"{count} event{'s' if count != 1 else ''} ({format_us(float(rows['dur'].sum()))}: {shown}{more})"


def _short(name: str, limit: int = 60) -> str:
    return name if len(name) <= limit else name[: limit - 1] + "…"


def _note(check: str, severity: str, message: str) -> dict[str, str]:
    return {"check": check, "severity": severity, "message": message}


def format_us(us: float) -> str:
    """A duration for people: µs, ms or s."""
    if abs(us) < 1e3:
        return f"{us:.1f} µs"
    return f"{us / 1e3:.1f} ms" if abs(us) < 1e6 else f"{us / 1e6:.2f} s"


_MATCHES: dict[tuple[re.Pattern, bool], dict[str, bool]] = {}
_MATCHES_KEPT = 200_000  # distinct names remembered per pattern; a long-lived process starts over past it


def kind_in(events: pd.DataFrame, *kinds: str) -> np.ndarray:
    """Which events are of one of ``kinds``, from the categorical's codes (no strings made per event)."""
    # A lookup of each code: a byte an event, where isin's temporaries were six (code -1, no kind, takes the last).
    table = np.zeros(len(KINDS) + 1, dtype=bool)
    table[[KINDS.index(k) for k in kinds]] = True
    return table[events["kind"].array.codes]


def step_marks(events: pd.DataFrame) -> np.ndarray:
    """Which events are the profiled steps: ProfilerStep#N annotations recorded on the host. Newer
    Kineto writes each step on the device too (a gpu_user_annotation over its kernels): no second step."""
    host = (events["stream"] < 0).to_numpy() & ~kind_in(events, MARKER)
    return host & name_matches(events["name"], STEP_ANNOTATION)


def name_matches(names: pd.Series, pattern: re.Pattern, search: bool = False) -> np.ndarray:
    """Which events' (categorical) names match ``pattern`` (at the start, or anywhere with ``search``):
    each distinct name is matched once, and remembered (the ranks of a job share their names)."""
    if not isinstance(names.dtype, pd.CategoricalDtype):
        test = pattern.search if search else pattern.match
        return np.array([test(str(n)) is not None for n in names], dtype=bool)
    return _per_event(names, _name_hits(names, pattern, search), False)


def _name_hits(names: pd.Series, pattern: re.Pattern, search: bool = False) -> np.ndarray:
    """Whether each of the categorical ``names``' distinct names matches ``pattern`` (remembered)."""
    test = pattern.search if search else pattern.match
    known = _MATCHES.setdefault((pattern, search), {})
    if len(known) > _MATCHES_KEPT:
        known.clear()
    return np.array([known[n] if n in known else known.setdefault(n, test(str(n)) is not None)
                     for n in names.cat.categories], dtype=bool)


def _per_event(names: pd.Series, per_name: np.ndarray, missing: object) -> np.ndarray:
    """``per_name`` (one value per distinct name) for each event, ``missing`` where an event has no name."""
    table = np.append(per_name, np.array(missing, dtype=per_name.dtype))  # code -1 (no name) takes the last
    return table[names.array.codes]
