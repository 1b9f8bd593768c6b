"""Every number `diagtrain compare` decides by, as typed settings (util/settings.py): listed by
``diagtrain analyze --settings``, overridden with ``diagtrain compare --set compare.NAME=VALUE``, and
recorded in the comparison's report.

Its warm-up differs from the analysis' (detectors.base.Steady, a number of steps) on purpose: a
baseline keeps each run's steps without the run's directory, so it cuts a share of every run, which
holds for runs of any length (a 30-step CI run and a 3,000-step nightly one alike).
"""

from __future__ import annotations

import math
from typing import Any

from diagtrain.profiler.util.settings import section, setting, values


@section("compare")
class CompareSettings:
    """When a change between runs is a regression, an improvement or noise."""

    # The textbook 95% prediction interval for one more run (2.5% in each tail): a clean run lands above it once in
    # 40 comparisons of one metric. At 1% (t = 6.96 with 3 runs) a 3x slowdown of a phase stayed inside the band
    # beside two CPU hogs.
    between_runs_alpha: float = setting(0.025, "one-sided tail of the t prediction interval of one more clean run: the "
                                        "share of clean runs of one metric that would read as a change")
    # Clean runs of one job on a busy 2-core host had median step times of 89, 139, 147 and 158 ms (x1.8 apart).
    one_run_ceiling: float = setting(2.5, "with one baseline run (its spread unknown) only a change beyond this ratio "
                                     "is called: clean runs here differed by up to x1.8")
    # Peak memory of clean runs differed by up to 9% here (491-536 MiB); it does not follow the host's load.
    one_run_ceiling_memory: float = setting(1.5, "... for peak memory: clean runs' peaks differed by up to 9%")
    # A preemption costs a few-ms phase a whole time slice (rank 1's 7 ms phase took 26 ms in the next run).
    one_run_step_share: float = setting(0.25, "from one run, a phase or collective must also grow by this share of a "
                                        "step: clean runs' step times differed by up to ~20%")
    material_step_share: float = setting(0.05, "from several runs, a phase or collective must grow by this share of a "
                                         "step: a change under 5% of a step is the step time's to show")
    min_spread_pct: float = setting(2.0, "the spread of k runs' paces is never taken as smaller than this (%): quartiles "
                                    "of a few dozen steps are not known better")
    # 250 comparisons of a clean run against 3 of 12 others: 15 false regressions on medians, 3 on the quartile.
    pace_quantile: float = setting(25.0, "a run's pace is this percentile of its step times (100 minus it for "
                                   "throughput): a busy host only adds time, and to a stretch of a run")
    recommended_runs: int = setting(3, "the fewest baseline runs whose t interval (4.30 sd; 12.7 with 2) is narrow "
                                    "enough to be useful")
    step_alpha: float = setting(0.01, "the per-step evidence (Mann-Whitney, bootstrap) must agree at this level: one "
                                "false 'the steps differ' in a hundred identical distributions")
    min_samples: int = setting(5, "fewer steps than this in a run cannot tell a change from noise")
    min_change_ms: float = setting(1.0, "the smallest change of a time worth a verdict (a 0.4 ms phase going to 0.5 is "
                                   "not '+25%')")
    min_change_mib: float = setting(16.0, "the smallest change of peak memory worth a verdict")
    more_runq_share: float = setting(0.1, "NEW's ranks waited this share of their steps more for a CPU than the "
                                     "baseline's: it ran beside more load, and its times cannot be judged")
    more_throttled_share: float = setting(0.1, "NEW's GPUs throttled in this share more of their samples: the same")
    warmup_share: float = setting(0.1, "each run's first steps, this share of them (at least one), are left out: "
                                  "start-up costs (see the module's note on the analysis' warm-up)")

    @property
    def min_log_spread(self) -> float:
        """``min_spread_pct`` on the log scale the band is measured on."""
        return math.log1p(self.min_spread_pct / 100)


def in_force() -> dict[str, Any]:
    """What a comparison's report records: every value in force, and those that differ from the defaults."""
    now, defaults = values(CompareSettings.active()), values(CompareSettings())
    return {"values": now, "overridden": {k: v for k, v in now.items() if v != defaults[k]}}
