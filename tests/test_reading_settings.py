"""The rank stage's settings (per_rank/reading.py) reach the worker processes that read the ranks, and a rank's
cache is used again only for the settings it was made with (issue 50: no number decides unseen)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest

from diagtrain.profiler.analyzer.per_rank import cache as rank_cache
from diagtrain.profiler.analyzer.per_rank.pipeline import load_rank
from diagtrain.profiler.analyzer.per_rank.pool import Pool, load_on
from diagtrain.profiler.analyzer.per_rank.reading import Reading
from diagtrain.profiler.analyzer.read.discover import discover
from diagtrain.profiler.run_dir import ANALYSIS_CACHE
from diagtrain.profiler.util import settings

HTA = Path(__file__).parent / "fixtures" / "public" / "traces" / "hta"
COARSE = {"coalesce_gap_us": 1e9}  # every op of a step one stretch of work


def minitoy():
    """HTA's ROCm toy trace: 15 stretches of work in its steps at the default gap."""
    return next(i for i in discover(HTA)[0] if i.key == "rocm_mi250_minitoy.json.gz")


def test_a_rank_is_read_with_the_settings_handed_to_it_and_cached_for_them(tmp_path):
    item = minitoy()
    default = load_rank(item, tmp_path)
    coarse = load_rank(item, tmp_path, COARSE)
    again = load_rank(item, tmp_path)  # the cache made with the default, not the coarse one written since
    assert len(default.segments) == len(again.segments) == 15 and len(coarse.segments) == 1
    with settings.overriding({"reading": COARSE}):  # no values handed: those in force here
        assert len(load_rank(item, tmp_path).segments) == 1


def test_the_analysis_reads_with_its_reading_settings_and_records_them(tmp_path):
    from diagtrain.profiler.analyzer.analyze import analyze
    from diagtrain.profiler.analyzer.judge.judgement import all_sections

    folder = tmp_path / "traces"
    folder.mkdir()
    (folder / "rank0.json.gz").write_bytes((HTA / "rocm_mi250_minitoy.json.gz").read_bytes())
    doc = analyze(folder, tmp_path / "out", ["json"], workers=1, overrides=settings.parse(["reading.coalesce_gap_us=1e9"]))
    assert doc["settings"]["overridden"] == {"reading.coalesce_gap_us": 1e9}
    assert doc["settings"]["values"]["reading.coalesce_gap_us"] == 1e9 and "reading" in all_sections()
    # The rank was read with them: its cache is the one made for them, not for the defaults.
    [item] = discover(folder)[0]
    cache, coarse = tmp_path / "out" / ANALYSIS_CACHE / item.key, {**asdict(Reading()), **COARSE}
    assert rank_cache.read_cache(cache, rank_cache.signature(item, coarse)) is not None
    assert rank_cache.read_cache(cache, rank_cache.signature(item, asdict(Reading()))) is None


@pytest.mark.jobs
def test_a_pool_worker_reads_with_the_analysis_settings_not_its_own(tmp_path):
    with Pool(1) as pool:
        pool.submit(abs, 1).result()  # its worker started before the override (a fork would copy it): it has none
        with settings.overriding({"reading": COARSE}):
            results, skipped, died = load_on(pool, (), [minitoy()], tmp_path, lambda _: None, {"coalesce_gap_us": 1e9})
    assert not skipped and not died and len(results[0].segments) == 1
