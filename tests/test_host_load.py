"""Each host's CPU load as run/host_load.py measures it, numbered hosts and arrays (issue 62: 40 ms of a live
judgement at 8,192 ranks), held to the text-keyed group-bys it replaced (tests/host_load_reference.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import host_load_reference as reference
from diagtrain.profiler.analyzer.run.host_load import host_loads
from diagtrain.profiler.analyzer.run.tables import Tables


def random_run(seed: int) -> Tables:
    """Ranks on a few hosts in any order, some without a host, some hosts' ranks without steps, rows in any order,
    missing starts, ends, run-queue waits and step times, and now and then no run-queue column at all."""
    rng = np.random.default_rng(seed)
    ranks = int(rng.integers(1, 40))
    hosts = {r: (f"node-{int(rng.integers(0, 6))}" if rng.random() > 0.1 else None) for r in range(ranks)}
    rows = []
    for rank in rng.permutation(ranks + 3).tolist():  # 3 ranks of no known host
        if rng.random() < 0.15:
            continue  # a rank without steps
        for step in range(int(rng.integers(1, 8))):
            start = 1000.0 + step + rng.random()
            rows.append({"rank": rank, "step": step, "start": start if rng.random() > 0.05 else np.nan,
                         "end": start + rng.random() if rng.random() > 0.05 else np.nan,
                         "wall_ms": float(rng.integers(0, 100)) if rng.random() > 0.05 else np.nan,  # 0: a share of inf or NaN
                         "runq_ms": float(rng.integers(0, 20)) if rng.random() > 0.3 else np.nan})
    steps = pd.DataFrame(rows).sample(frac=1.0, random_state=seed) if rows else \
        pd.DataFrame(columns=["rank", "step", "start", "end", "wall_ms", "runq_ms"])
    if seed % 5 == 0:
        steps = steps.drop(columns=["runq_ms"])
    return Tables(steps=steps, ranks=pd.DataFrame(), collectives=pd.DataFrame(), phases=[], rank_hosts=hosts)


@pytest.mark.parametrize("seed", range(60))
def test_host_loads_are_the_text_keyed_ones(seed: int) -> None:
    t = random_run(seed)
    # repr: NaN in a time range is the same NaN both ways (a dataclass's == would call them unequal)
    assert repr(host_loads(t, t.steps)) == repr(reference.host_loads(t, t.steps))


def test_host_loads_name_each_hosts_wait() -> None:
    """Values that would be wrong if a host's ranks were mixed up: node-b's two ranks wait 10 and 30 ms of 100."""
    steps = pd.DataFrame({"rank": [0, 1, 2, 0, 1, 2], "step": [1, 1, 1, 2, 2, 2],
                          "start": [1.0, 1.0, 1.5, 2.0, 2.0, 2.5], "end": [1.1, 1.2, 1.6, 2.1, 2.2, 2.9],
                          "wall_ms": [100.0] * 6, "runq_ms": [10.0, 0.0, 30.0, 10.0, 0.0, 30.0]})
    loads = host_loads(Tables(steps=steps, ranks=pd.DataFrame(), collectives=pd.DataFrame(), phases=[],
                              rank_hosts={0: "node-b", 1: "node-a", 2: "node-b"}),
                       steps)
    assert list(loads) == ["node-a", "node-b"]
    assert loads["node-b"].ranks == [0, 2] and loads["node-b"].runq_ms == 20.0 and loads["node-b"].runq_share == 0.2
    assert loads["node-b"].time_range == (1.0, 2.9) and loads["node-a"].time_range == (1.0, 2.2)
    assert loads["node-a"].runq_ms == 0.0


def test_steady_host_loads_are_made_once_per_steps_and_settings() -> None:
    """The detector and the contention assessment read one measurement; other settings or steps measure again."""
    from diagtrain.profiler.analyzer.judge.detectors.base import steady_host_loads
    from diagtrain.profiler.util import settings

    t = random_run(1)
    first = steady_host_loads(t)
    assert steady_host_loads(t) is first
    with settings.overriding(settings.parse(["contention.runq_min_share=0.5"])):
        assert steady_host_loads(t) is not first
    t.steps = t.steps.copy()
    again = steady_host_loads(t)
    assert again is not first and repr(again) == repr(first)


def test_the_hosts_kept_for_the_next_call_follow_a_changed_rank() -> None:
    """The hosts made from the ranks' records are kept while the very same records come: a rank moved to another
    host in place, an equal dict of other objects, or a load's ranks changed by its reader are each seen."""
    t = random_run(7)
    first = host_loads(t, t.steps)
    assert repr(first) == repr(reference.host_loads(t, t.steps))
    next(iter(first.values())).ranks.append(10_000)  # a reader's change to a load: not the next call's
    assert repr(host_loads(t, t.steps)) == repr(reference.host_loads(t, t.steps))
    moved = next(r for r, h in t.rank_hosts.items() if h is not None)
    t.rank_hosts[moved] = "node-elsewhere"  # the same dict, changed in place
    assert repr(host_loads(t, t.steps)) == repr(reference.host_loads(t, t.steps))
    t.rank_hosts = {r: None if h is None else "".join(h) for r, h in reversed(t.rank_hosts.items())}
    assert repr(host_loads(t, t.steps)) == repr(reference.host_loads(t, t.steps))
    del t.rank_hosts[moved]
    assert repr(host_loads(t, t.steps)) == repr(reference.host_loads(t, t.steps))


@pytest.mark.parametrize("seed", range(20))
def test_host_loads_of_runs_one_after_another_are_each_their_own(seed: int) -> None:
    """Each run of a sequence measured as if alone, whatever the hosts kept from the run before it."""
    for t in (random_run(seed), random_run(seed + 100), random_run(seed)):
        assert repr(host_loads(t, t.steps)) == repr(reference.host_loads(t, t.steps))
