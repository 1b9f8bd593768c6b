"""The notebook guide's worked example (docs/guide/notebook.md), as a script CI runs (tests/test_notebook.py).

    python docs/examples/notebook.py RUN_DIR

Each cell of the guide is a block here, in the same order.
"""

import sys

import diagtrain

# 1. Load a run: its analysis, analyzed first where there is none.
run = diagtrain.load(sys.argv[1])
print(run)

# 2. The findings, most worth fixing first: kind, severity, ranks, steps, what it cost, why, what to do.
top = run.findings[0]
print(top.kind, top.severity, top.ranks, f"{top.impact_ms or 0:.1f} ms/step")
print(top.explanation)

# 3. The tables, as DataFrames on the run's clock: which rank is slowest, step by step?
steps = run.steps
slowest = steps.loc[steps.groupby("step")["wall_ms"].idxmax(), ["step", "rank", "wall_ms"]]
print(slowest.tail())

# 4. Where the time went (the ledger): which rank did the others wait for, and how much did it cost?
ledger = run.ledger
print(ledger[ledger["waited_for"] >= 0].groupby("waited_for")["lost_ms"].sum().sort_values(ascending=False))

# 5. A rank's profiled operators in one step, and the collectives the others waited in.
profiled = sorted(steps.loc[steps["profiled"], "step"].unique())
if profiled:
    spans = run.spans(top.ranks[0], steps=[profiled[0]])
    print(spans.assign(ms=(spans["end_us"] - spans["start_us"]) / 1e3).groupby("kind")["ms"].sum())
print(run.collectives[["rank", "op", "seq", "wait_us", "last_rank"]].head())

# 6. Figures (plotly): the timeline of the straggler and a peer over a few steps, the rank x step heatmap.
figure = run.timeline(ranks=[0, top.ranks[0]], steps=profiled[:1] or None)
heat = run.heatmap("wall_ms")
print(type(figure).__name__, len(figure.data), "traces;", type(heat).__name__)
