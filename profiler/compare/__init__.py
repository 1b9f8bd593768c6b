"""After several runs: a run reduced to a summary, baselines, and the regression gate of `diagtrain compare`.

Reads only what the analyzer wrote (analysis/*.parquet, report.json) or a stored baseline file.
"""
