"""A bounded run directory (issue 62): a rank's step records closed into numbered segments past a size, the
closed ones compressed by the wrapper, and every reader (the final one and its cache, the live tails, the host
summaries) reading the segments in order then steps.jsonl: the records read back are the records written."""

from __future__ import annotations

import gzip
import json
import math
import os
import random
import shutil
from pathlib import Path

import pandas as pd
import pytest

from diagtrain.profiler.analyzer.per_rank import load
from diagtrain.profiler.analyzer.read import step_cache
from diagtrain.profiler.analyzer.read.discover import discover
from diagtrain.profiler.analyzer.read.host_summary import HostReducer, HostSummary, summary_path
from diagtrain.profiler.analyzer.read.step_cache import extend_cache, read_steps, read_steps_cached
from diagtrain.profiler.analyzer.read.run_files import read_host_telemetry
from diagtrain.profiler.analyzer.read.step_tail import StepFilesTail
from diagtrain.profiler.analyzer.run import tables
from diagtrain.profiler.collect.telemetry import TelemetrySampler, thin_samples
from diagtrain.profiler.run_dir import (STEP_SEGMENT_BYTES_ENV, JsonlAppender, Records, closed_segments,
                                        compress_segments, segment_path, step_segment_bytes, telemetry_rows,
                                        write_json_atomic)
from diagtrain.profiler.util.bounded_read import InputError

from conftest import USER_SCRIPT, diagtrain_run, torchrun, wait_until
from test_step_cache import varied

T0 = 1_790_000_000.0


def realistic(step: int, rng: random.Random, rank: int = 0) -> dict:
    """A step record shaped as a CPU rank under `diagtrain run` writes it (tests/fixtures/recorded_runs), its
    timings and counters varying in every digit as measured ones do: the least compressible honest records."""
    phases = ("data", "forward", "backward", "optimizer", "metrics")
    start = T0 + step * 0.25
    duration = rng.uniform(200, 260)
    return {"schema_version": 1, "rank": rank, "step": step, "start": round(start, 6),
            "end": round(start + duration / 1e3, 6), "duration_ms": round(duration, 3),
            "phases_ms": {p: round(rng.uniform(0, 200), 3) for p in phases},
            "phase_comm_ms": {p: round(rng.uniform(0, 150), 3) for p in phases},
            "cpu_ms": round(rng.uniform(60, 110), 3), "comm_ms": round(rng.uniform(150, 170), 3),
            "comm_calls": rng.randint(2, 5), "runq_ms": round(rng.uniform(0, 2), 3), "page_faults": rng.randint(0, 20000),
            "rss_bytes": 428109824 + rng.randint(0, 1 << 20) * 4096, "peak_mem_bytes": 428109824,
            "mem_source": "rss_peak", "samples": 8, "tokens": 512, "loss": rng.uniform(4, 6)}


def step_files(folder: Path) -> list[Path]:
    """A rank's step record files, in reading order: its segments, then steps.jsonl."""
    return [p for _, p in closed_segments(folder / "steps.jsonl")] + [folder / "steps.jsonl"]


def joined(folder: Path) -> bytes:
    """Everything a rank's files hold, unpacked and in order: what one unsegmented steps.jsonl would hold."""
    return b"".join(gzip.decompress(p.read_bytes()) if p.name.endswith(".gz") else p.read_bytes()
                    for p in step_files(folder) if p.exists())


def assert_same_read(segmented, plain) -> None:
    """Two reads of step records (StepFile) found the same rows, phases, problems and point-to-point calls."""
    pd.testing.assert_frame_equal(segmented.table, plain.table, check_like=True)
    assert (segmented.phases, segmented.lines, segmented.repeated, segmented.p2p) == (
        plain.phases, plain.lines, plain.repeated, plain.p2p)
    assert (segmented.impossible_count, segmented.impossible[:3]) == (plain.impossible_count, plain.impossible[:3])
    assert (segmented.bad_count, segmented.bad_lines[:3]) == (plain.bad_count, plain.bad_lines[:3])


def test_the_segment_size_is_a_setting_and_an_environment_variable_that_says_what_is_wrong():
    assert step_segment_bytes({}) == Records().step_segment_bytes == 32 << 20
    assert step_segment_bytes({STEP_SEGMENT_BYTES_ENV: "4096"}) == 4096
    for bad in ("0", "-5", "64MiB"):
        with pytest.raises(ValueError, match=rf"\$DIAGTRAIN_STEP_SEGMENT_BYTES={bad!r}: not a positive number of bytes"):
            step_segment_bytes({STEP_SEGMENT_BYTES_ENV: bad})


def test_the_appender_closes_segments_at_record_ends_and_numbers_them_after_those_there(tmp_path):
    path = tmp_path / "steps.jsonl"
    appender = JsonlAppender(path, max_bytes=1000)
    written = [varied(s) for s in range(1, 40)]
    for record in written:
        appender.append(record)
    appender.close()
    segments = closed_segments(path)
    assert [n for n, _ in segments] == list(range(1, len(segments) + 1)) and len(segments) >= 5
    for _, segment in segments:
        assert segment.read_bytes().endswith(b"\n") and 1000 <= segment.stat().st_size < 1000 + 400
    compress_segments(path, up_to=2)
    assert [p.name for _, p in closed_segments(path)][:3] == ["steps.1.jsonl.gz", "steps.2.jsonl.gz", "steps.3.jsonl"]
    again = JsonlAppender(path, max_bytes=1000)  # a restarted rank: on after the last segment, compressed or not
    for record in written:
        again.append(record)
    again.close()
    assert [json.loads(line) for line in joined(tmp_path).splitlines()] == written + written
    assert [n for n, _ in closed_segments(path)] == list(range(1, len(closed_segments(path)) + 1))


@pytest.mark.parametrize("seed", range(8))
def test_segmented_records_read_through_the_cache_as_one_plain_file_reads(tmp_path, seed, monkeypatch):
    """Records written through a closing appender and through a plain one; at random moments the cache is brought
    up to date as the wrapper does (extend_cache), read as an analysis does, and closed segments compressed: every
    read equals the full read of the plain file, repeated steps, impossible values and point-to-point calls
    included."""
    monkeypatch.setattr(step_cache, "SMALL_PART_ROWS", 8)
    rng = random.Random(seed)
    (tmp_path / "seg").mkdir()
    (tmp_path / "plain").mkdir()
    path, plain_path, cache = tmp_path / "seg" / "steps.jsonl", tmp_path / "plain" / "steps.jsonl", tmp_path / "cache"
    segmented, plain = JsonlAppender(path, max_bytes=rng.choice([600, 2000, 5000])), JsonlAppender(plain_path)
    for i in range(rng.randint(50, 250)):
        step = rng.randint(1, 60) if rng.random() < 0.05 else i + 1
        record = varied(step) if rng.random() < 0.95 else {**varied(step), "duration_ms": 1e18}
        segmented.append(record)
        plain.append(record)
        roll = rng.random()
        if roll < 0.08:
            extend_cache(path, 0, cache, small_rows=8)
        elif roll < 0.12:
            assert_same_read(read_steps_cached(path, 0, cache), read_steps(plain_path, 0))
        elif roll < 0.16:
            compress_segments(path, up_to=rng.randint(0, 20))
    segmented.close()
    plain.close()
    assert joined(tmp_path / "seg") == plain_path.read_bytes()
    assert_same_read(read_steps_cached(path, 0, cache), read_steps(plain_path, 0))
    compress_segments(path)
    assert_same_read(read_steps_cached(path, 0, cache), read_steps(plain_path, 0))
    assert_same_read(read_steps(path, 0), read_steps(plain_path, 0))


def test_live_tails_follow_closes_and_compression_without_losing_or_repeating_a_line(tmp_path):
    rng = random.Random(7)
    path = tmp_path / "steps.jsonl"
    appender = JsonlAppender(path, max_bytes=700)
    tails = [StepFilesTail(path) for _ in range(3)]
    got: list[list[dict]] = [[] for _ in tails]
    written = []
    for step in range(1, 1500):
        record = {"step": step, "pad": "x" * rng.randint(0, 60)}
        appender.append(record)
        written.append(record)
        for k, tail in enumerate(tails):  # a reader every step, one now and then, one rarely
            if rng.random() < (1.0, 0.05, 0.005)[k]:
                got[k] += tail.read_json()
        if rng.random() < 0.03:
            compress_segments(path, up_to=rng.randint(0, 200))  # even segments a slow reader is not past yet
    appender.close()
    compress_segments(path)
    for k, tail in enumerate(tails):
        got[k] += tail.read_json()
        assert got[k] == written and tail.lines == len(written)
    assert StepFilesTail(path).read_json() == written  # a reader that comes when every segment is compressed


def test_a_crash_at_any_point_of_a_close_or_a_compression_leaves_every_record_readable(tmp_path):
    """The states a killed rank or wrapper can leave, made on disk: a segment renamed and no fresh steps.jsonl; a
    segment both compressed and still plain; a compression's temp file half written."""
    folder = tmp_path / "ranks" / "0"
    folder.mkdir(parents=True)
    path = folder / "steps.jsonl"
    appender = JsonlAppender(path, max_bytes=800)
    written = [varied(s) for s in range(1, 30)]
    for record in written:
        appender.append(record)
    appender.close()
    last = closed_segments(path)[-1][0]
    os.replace(path, segment_path(path, last + 1))  # killed after its rename, before the fresh file
    segment = segment_path(path, 1)
    (folder / "steps.1.jsonl.gz").write_bytes(gzip.compress(segment.read_bytes()))  # killed before the removal
    (folder / ".steps.2.jsonl.gz.tmp-99").write_bytes(gzip.compress(b'{"step": 1}\n')[:10])  # killed mid-write
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in written))
    assert_same_read(read_steps(path, 0), read_steps(plain, 0))
    assert StepFilesTail(path).read_json() == written
    compress_segments(path)  # the next wrapper finishes the job
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith("steps")) == [
        f"steps.{n}.jsonl.gz" for n in sorted(range(1, last + 2), key=str)]
    assert_same_read(read_steps(path, 0), read_steps(plain, 0))


def test_a_damaged_segment_is_an_error_naming_it(tmp_path):
    path = tmp_path / "steps.jsonl"
    appender = JsonlAppender(path, max_bytes=500)
    for step in range(1, 20):
        appender.append(varied(step))
    appender.close()
    compress_segments(path)
    damaged = segment_path(path, 2, compressed=True)
    damaged.write_bytes(damaged.read_bytes()[:-30])
    with pytest.raises(InputError, match=rf"{damaged}: the gzip stream ends early"):
        read_steps(path, 0)


def test_a_host_summary_carries_every_record_of_segmented_ranks(tmp_path):
    """The host reducer reads its ranks through closes (and compresses what it is past); the judge's reading of its
    summary holds every step each rank recorded, once."""
    run = tmp_path / "run"
    appenders = {}
    for rank in (0, 1):
        folder = run / "ranks" / str(rank)
        folder.mkdir(parents=True)
        write_json_atomic(folder / "rank.json", {"rank": rank, "host": "h", "world_size": 2})
        appenders[rank] = JsonlAppender(folder / "steps.jsonl", max_bytes=900)
    reducer = HostReducer(run, "h")
    reader = HostSummary(summary_path(run, "h"), keep=None)
    for step in range(1, 120):
        for rank, appender in appenders.items():
            appender.append(varied(step, rank))
        if step % 7 == 0:
            reducer.reduce()
            reader.read()
    reducer.reduce()
    reader.read()
    for rank in (0, 1):
        assert sorted(reader.ranks[rank].rows) == list(range(1, 120))
        names = [p.name for p in step_files(run / "ranks" / str(rank))]
        assert sum(n.endswith(".gz") for n in names) >= len(names) - 3  # closed ones compressed once read


def test_the_step_records_of_a_million_step_rank_take_at_most_a_third_of_their_plain_bytes(tmp_path):
    """Scaled 1:64: 15,625 steps closed at 512 KiB stand for 1,000,000 steps closed at 32 MiB (the default), the same
    count of segments and the same share left uncompressed; a gzip stream's ratio does not depend on its length past
    its 32 KiB window. The records vary in every digit (realistic(), less compressible than measured ones)."""
    scale = 64
    steps, segment = 1_000_000 // scale, Records().step_segment_bytes // scale
    rng = random.Random(0)
    plain, segmented = JsonlAppender(tmp_path / "plain.jsonl"), JsonlAppender(tmp_path / "steps.jsonl", segment)
    for step in range(1, steps + 1):
        record = realistic(step, rng)
        plain.append(record)
        segmented.append(record)
    plain.close()
    segmented.close()
    compress_segments(tmp_path / "steps.jsonl")
    before = (tmp_path / "plain.jsonl").stat().st_size
    after = sum(p.stat().st_size for p in step_files(tmp_path))
    assert after <= before / 3, f"{after} bytes of {before}: {after / before:.2f}"
    assert joined(tmp_path) == (tmp_path / "plain.jsonl").read_bytes()  # losslessly


@pytest.mark.jobs
def test_a_real_job_closes_segments_and_its_analysis_reads_as_unsegmented(tmp_path):
    """A 2-rank torchrun job under `diagtrain run` whose ranks close their steps.jsonl every few records: the
    wrapper compressed every closed segment by the end, the live host summary carried every step, and the final
    analysis' steps table is the one of the same run with each rank's records joined into one plain file."""
    out = tmp_path / "run"
    diagtrain_run(out, "--profile-steps", "none", "--telemetry-interval", "0.5", "--no-analyze", "--",
                  *torchrun(2), str(USER_SCRIPT),
                  env={"STEPS": "40", "STEP_SLEEP": "0.15", STEP_SEGMENT_BYTES_ENV: "2048"})
    plain = tmp_path / "plain"
    shutil.copytree(out, plain)
    for rank in (0, 1):
        folder = out / "ranks" / str(rank)
        names = [p.name for p in step_files(folder)]
        assert len(names) >= 5 and all(n.endswith(".gz") for n in names[:-1]), names
        records = [json.loads(line) for line in joined(folder).splitlines()]
        assert [r["step"] for r in records if "step" in r] == list(range(1, 41))
        for p in step_files(plain / "ranks" / str(rank)):
            p.unlink()
        (plain / "ranks" / str(rank) / "steps.jsonl").write_bytes(joined(folder))
    summary = HostSummary(next(out.glob("hosts/*/steps_summary.jsonl")), keep=None)
    summary.read()
    for rank, held in summary.ranks.items():  # read live across closes: no step lost or repeated (the last reduce
        last = max(held.rows)                 # comes up to 2 s before the job's end: the last steps may be after it)
        assert sorted(held.rows) == list(range(1, last + 1)) and held.found.repeated == 0 and last >= 10, held.rows

    def steps(run: Path, cached: bool) -> tuple:
        cache_root = run / "analysis" / "cache"
        results = load.load(discover(run)[0], cache_root, workers=1)[0]
        built = tables.build(run, results, None, cache_root if cached else None)
        return built.steps, built.phases, built.notes

    segmented, unsegmented = steps(out, True), steps(plain, False)
    pd.testing.assert_frame_equal(segmented[0], unsegmented[0])
    assert segmented[1:] == unsegmented[1:] and len(segmented[0]) == 80
    pd.testing.assert_frame_equal(steps(out, True)[0], unsegmented[0])  # again, from the cache


def test_telemetry_beyond_a_horizon_is_kept_at_the_coarse_interval(tmp_path):
    """The real sampler (psutil), its horizon and coarse interval scaled down: every segment older than a horizon
    (all closed ones but the newest) holds one sample per coarse interval, compressed; the newest and telemetry.jsonl
    every sample; the readers take them in order."""
    host_dir = tmp_path / "hosts" / "h"
    host_dir.mkdir(parents=True)
    bounds = Records(telemetry_horizon_s=0.4, telemetry_coarse_s=0.25)
    sampler = TelemetrySampler(tmp_path, host_dir, "h", 0.02, lambda _: None, bounds=bounds)
    sampler.start()
    wait_until(lambda: len(closed_segments(host_dir / "telemetry.jsonl")) >= 4, "four telemetry segments", 60)
    sampler.stop()
    segments = closed_segments(host_dir / "telemetry.jsonl")
    assert all(p.name.endswith(".gz") for _, p in segments[:-1]) and not segments[-1][1].name.endswith(".gz")

    def times(path: Path) -> list[float]:
        return sorted({json.loads(line)["time"] for line in (gzip.decompress(path.read_bytes()) if path.suffix == ".gz"
                                                             else path.read_bytes()).splitlines()})

    for _, path in segments[:-1]:
        kept = times(path)
        assert kept and len({math.floor(t / 0.25) for t in kept}) == len(kept)  # one sample per coarse interval
    fine = times(segments[-1][1]) + times(host_dir / "telemetry.jsonl")
    assert len(fine) >= 10 and max(b - a for a, b in zip(fine, fine[1:])) < 0.25  # every sample, as sampled
    rows = telemetry_rows(tmp_path)
    every = [t for _, p in segments for t in times(p)] + times(host_dir / "telemetry.jsonl")
    assert sorted({r["time"] for r in rows}) == every == sorted(every)
    assert len(read_host_telemetry(tmp_path / "hosts")) == len(rows)  # the analysis' bounded reader: the same rows


def test_thinning_keeps_whole_samples_and_leaves_out_cut_lines():
    rows = [{"kind": k, "time": t} for t in (0.0, 0.5, 1.0, 1.2, 2.9, 3.0) for k in ("host", "process")]
    data = b"".join(json.dumps(r).encode() + b"\n" for r in rows) + b'{"kind": "host", "ti'
    kept = [json.loads(line) for line in thin_samples(data, 1.0).splitlines()]
    assert [(r["kind"], r["time"]) for r in kept] == [(k, t) for t in (0.0, 1.0, 2.9, 3.0) for k in ("host", "process")]
