"""The words of a rank doing more work than its peers on a crowded host (judge/assessments/contention.py): a
straggler, case "more_work", whose explanation is its remark's (report/wording.py's ``PHRASES``)."""

from __future__ import annotations

from diagtrain.profiler.analyzer.report.words import Words

WORDS = {"straggler/more_work": Words(
    "",
    lambda f: (f"Give rank {f['ranks'][0]} the same share of the work as its peers (its batch, its data shard, its "
               "layers), or do the extra work (logging, evaluation) off the training loop."))}
