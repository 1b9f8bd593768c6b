"""The straggler detector's comparison as it was written first, one step at a time: the reference its
vectorized form (judge/detectors/straggler.py) must match to the bit (tests/test_straggler_vectorized.py,
tests/test_ledger_vectorized.py). Kept here, not in the package: nothing runs it but the tests."""

from __future__ import annotations

import numpy as np
import pandas as pd

from diagtrain.profiler.analyzer.judge.detectors import straggler as st
from diagtrain.profiler.analyzer.judge.own_time import OwnTime, blocked_column
from diagtrain.profiler.analyzer.judge.quantities import DEVICE_MEASURES, Measure, phase as phase_quantity
from diagtrain.profiler.util.groups import Groups, positions_by, ranked
from diagtrain.profiler.util.stats import median_known


def over_peers(step: int, ranks: np.ndarray, values: np.ndarray, label: str, usual: np.ndarray, noise: np.ndarray,
               source: str, threshold: float, step_ms: float, s: st.Straggler) -> list[dict]:
    """The rank whose value stands above the rest of one step, beyond the noise, if one does."""
    if len(values) < 2 or np.isnan(values).any():
        return []
    top = int(np.argmax(values))
    peers = np.delete(values, top)
    peer = float(np.median(peers))
    others = ranks != ranks[top]
    excess = values[top] - max(peer, median_known(usual[others]))
    spread_rest = float(peers.max() - peers.min()) if len(peers) > 1 else 0.0
    peer_noise = median_known(noise[others])
    if not np.isnan(peer_noise):
        limit = max(threshold, s.noise_sigmas * peer_noise)
    else:
        limit = max(threshold, s.unknown_noise_share * step_ms)
    if excess < limit or excess <= 2 * spread_rest:
        return []
    return [{"rank": int(ranks[top]), "step": int(step), "phase": label, "excess_ms": excess,
             "value_ms": float(values[top]), "peer_ms": peer, "source": source, "threshold_ms": limit}]


def waited(blocked: np.ndarray, ranks: np.ndarray, rank: int, excess_ms: float) -> bool:
    """Whether ``rank``'s excess in a phase in one step is mostly time blocked in collectives."""
    known = ~np.isnan(blocked)
    ranks, blocked = ranks[known], blocked[known]
    mine = ranks == rank
    if not mine.any() or len(blocked) < 2:
        return False
    return float(blocked[mine][0] - median_known(blocked[~mine])) >= OwnTime.active().waiting_share * excess_ms


def excess(steps: pd.DataFrame, phases: list[str], threshold: float, step_ms: float,
           s: st.Straggler) -> tuple[pd.DataFrame, tuple[np.ndarray, np.ndarray]]:
    """straggler._excess's candidates and compared pairs, by a loop over the steps."""
    quantities, measured = st._quantities(steps, phases)
    excluded = [phase_quantity(p).label for p in st.EXCLUDED_PHASES if phase_quantity(p).label in measured]
    traced = excluded + [label for label, q in measured.items() if q.measure not in st.RECORDED]
    phased = [label for m in st.RECORDED for label, q in measured.items() if q.measure is m]
    rows, compared = [], []
    ranks, values = steps["rank"].to_numpy(), quantities
    found_ranks, rank_at = ranked(ranks)
    by_rank = Groups(rank_at, len(found_ranks))
    usual_at, noise_at = {}, {}
    for label in measured:  # each rank's, per row
        usual, noise = st._usual(values[label], by_rank, s.min_noise_steps)
        usual_at[label], noise_at[label] = usual[rank_at], noise[rank_at]
    blocked = {c: steps[c].to_numpy(dtype=float) for c in steps.columns if str(c).endswith("_comm_wait_ms")}
    profiled_rows = steps["profiled"].to_numpy(dtype=bool) if "profiled" in steps else np.zeros(len(steps), bool)
    for step, group in positions_by(steps["step"].to_numpy()):
        profiled = bool(profiled_rows[group].all())
        for label in (traced if profiled and len(traced) > len(excluded) else phased):
            measure = measured[label].measure
            source = ("phases" if measure is Measure.PHASE else st.COUNTERS if measure is Measure.OWN_TIME
                      else st.DEVICE if measure in DEVICE_MEASURES else "trace")
            found = over_peers(step, ranks[group], values[label][group], label, usual_at[label][group],
                               noise_at[label][group], source, threshold, step_ms, s)
            column = blocked.get(blocked_column(measured[label]) or "")
            if found and column is not None and waited(column[group], ranks[group], found[0]["rank"],
                                                       found[0]["excess_ms"]):
                continue
            if found and label in excluded:
                group = group[ranks[group] != found[0]["rank"]]
                continue
            if found:
                rows += found
                break
        if len(group) >= 2:
            compared.append(group)
    at = np.concatenate(compared) if compared else np.zeros(0, dtype=int)
    return pd.DataFrame(rows, columns=st.SLOW_COLUMNS), st._pairs(ranks, steps["step"].to_numpy(), at)
