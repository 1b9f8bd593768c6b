"""What one live judgement costs the wrapper's CPU, at 8 and 64 ranks (issue 39: the wrapper's own CPU
under 2% of a core at 64 ranks, synthetic step records).

Synthetic step records of a synchronous job (as tests/test_ledger.py's ``records_run``): every rank
works data, forward, backward and optimizer with a little per-rank jitter, then waits in its backward
all-reduce for the slowest rank; rank 1 is a straggler (+60 ms forward every step). The window's
``window_steps`` steps are written first and judged once (the judge's first round: imports, first
read). Each measured judgement is then the wrapper's steady state: every rank appends one more step
and :meth:`LiveJudge.judge` runs once (read what is new, build the window's tables and ledger, run
the detectors and passes, follow the findings), then what it holds is spared the collector's passes where it read new
ranks (:meth:`LiveJudge.spare_readers`), as the wrapper does. The mean shows the collector's full passes, which the
median leaves out. CPU is ``time.process_time`` (the whole process,
this one thread), median of ``--reps``; the share of a core is that CPU over the wall time between
judgements the wrapper waits (``live.interval_s``, spaced out by ``live.max_cpu_share``), and at
fixed intervals of 2 and 5 s.

    python benchmarks/live_cost.py [--ranks 8 64] [--reps 15] [--profile 64] [--name live_cost]
    python benchmarks/live_cost.py --before /path/above/an/older/diagtrain [--rounds 3]

With ``--before`` the older code (a directory holding a ``diagtrain`` package, put first on
PYTHONPATH) and this code are measured in turns, each in a fresh process, ``--rounds`` times: on a
shared host the load changes from minute to minute, and both see the same minutes.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, save  # noqa: E402

from diagtrain.profiler.analyzer.judge.live_judge import Live, LiveJudge  # noqa: E402
from diagtrain.profiler.analyzer.read.host_summary import HostReducer  # noqa: E402
from diagtrain.profiler.run_dir import RankIndex, members_text, write_json_atomic  # noqa: E402

T0 = 1_790_000_000.0
RANKS_PER_HOST = 8


def host_of(rank: int) -> str:
    """The host folder of a rank: 8 ranks a host, as on a node of 8 GPUs."""
    return f"node-{rank // RANKS_PER_HOST}"
STRAGGLER, STRAGGLER_MS = 1, 60.0
FIXED_INTERVALS_S = (2.0, 5.0)
WAYS = {"reduced": "hosts reduce", "direct": "judge reads every rank"}


def own_ms(rank: int, step: int, straggler_from: int = 1) -> dict[str, float]:
    """One rank's own work in a step (ms): a little deterministic jitter, the straggler's extra forward."""
    slow = rank == STRAGGLER and step >= straggler_from
    return {"data": 1.0 + 0.3 * ((rank + step) % 3), "forward": 20.0 + 0.4 * ((rank * step) % 3)
            + (STRAGGLER_MS if slow else 0.0), "backward": 40.0, "optimizer": 5.0, "outside": 2.0}


class SyntheticJob:
    """Step records appended to ``root/ranks/<r>/steps.jsonl`` as a running synchronous job would."""

    def __init__(self, root: Path, ranks: int, straggler_from: int = 1) -> None:
        self.root, self.ranks, self.step, self.clock, self.straggler_from = root, ranks, 0, T0, straggler_from
        world = members_text(range(ranks))
        for r in range(ranks):
            folder = root / "ranks" / str(r)
            folder.mkdir(parents=True)
            write_json_atomic(folder / "rank.json", {"rank": r, "host": host_of(r), "hostname": host_of(r), "pid": 1,
                                                     "world_size": ranks})
            # As a rank writes it at its first step (state_dump.write_process_groups): the world's group.
            write_json_atomic(folder / "process_groups.json", {"0": {"desc": "default_pg", "members": world}})

    def bytes_written(self, reduced: bool) -> int:
        """The bytes the judge reads so far: every host's summary (``reduced``), else every rank's step records."""
        if reduced:
            return sum(p.stat().st_size for p in self.root.glob("hosts/*/steps_summary.jsonl"))
        return sum((self.root / "ranks" / str(r) / "steps.jsonl").stat().st_size for r in range(self.ranks))

    def append(self, steps: int = 1) -> None:
        """Every rank finishes ``steps`` more steps."""
        lines: dict[int, list[str]] = {r: [] for r in range(self.ranks)}
        for _ in range(steps):
            self.step += 1
            own = {r: own_ms(r, self.step, self.straggler_from) for r in range(self.ranks)}
            slowest = max(sum(o.values()) for o in own.values())
            for r, mine in own.items():
                wait = slowest - sum(mine.values()) + 1.0  # the all-reduce itself takes 1 ms on everyone
                phases = {"data": mine["data"], "forward": mine["forward"], "backward": mine["backward"] + wait,
                          "optimizer": mine["optimizer"]}
                wall = sum(phases.values()) + mine["outside"]
                lines[r].append(json.dumps({
                    "rank": r, "step": self.step, "start": self.clock, "end": self.clock + wall / 1e3,
                    "duration_ms": wall, "phases_ms": phases,
                    "phase_comm_ms": {"data": 0.0, "forward": 0.0, "backward": wait, "optimizer": 0.0},
                    "comm_ms": wait, "comm_calls": 1, "runq_ms": 0.1, "comm_runq_ms": 0.02,
                    "cpu_ms": wall - wait}))
            self.clock += (slowest + 1.0) / 1e3
        for r, new in lines.items():
            with open(self.root / "ranks" / str(r) / "steps.jsonl", "a") as f:
                f.write("\n".join(new) + "\n")


def measure(ranks: int, reps: int, profile: bool, reduced: bool = True) -> dict:
    """CPU seconds of ``reps`` steady-state judgements of ``ranks`` ranks (and the kinds they found); ``reduced``:
    every host's wrapper reduces its 8 ranks into its summary first (their CPU measured apart: each host's own)."""
    settings = Live.active()
    with tempfile.TemporaryDirectory() as tmp:
        job = SyntheticJob(Path(tmp), ranks)
        index = RankIndex(Path(tmp))  # one for all the hosts this process plays (each real one reads its own)
        hosts = [HostReducer(Path(tmp), host_of(r), index) for r in range(0, ranks, RANKS_PER_HOST)] if reduced else []
        job.append(settings.window_steps)
        reduce_cpu = _reduce(hosts)
        judge = LiveJudge(Path(tmp))
        first_cpu = time.process_time()
        first = _judged(judge, job.clock)
        first_cpu = time.process_time() - first_cpu
        found_at = job.step if _straggler_named(first.active) else None
        cpu, kinds, read = [], set(), []
        profiler = cProfile.Profile() if profile else None
        for _ in range(reps):
            size = job.bytes_written(reduced)
            job.append()
            reduce_cpu += _reduce(hosts)
            read.append(job.bytes_written(reduced) - size)  # what the judge reads: what was appended since it last read
            started = time.process_time()
            if profiler:
                profiler.enable()
            verdict = _judged(judge, job.clock)
            if profiler:
                profiler.disable()
            cpu.append(time.process_time() - started)
            kinds |= {(f["kind"], tuple(f["ranks"])) for f in verdict.active if f["severity"] != "info"}
            found_at = found_at or (job.step if _straggler_named(verdict.active) else None)
        if profiler:
            print(f"--- cProfile, {reps} judgements of {ranks} ranks ---")
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(35)
            pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    median = statistics.median(cpu)
    spaced_s = max(settings.interval_s, median / settings.max_cpu_share)  # as LiveJudge.judge paces itself
    return {"ranks": ranks, "reduced": reduced, "steps_judged": settings.window_steps, "reps": reps,
            "host_reduce_cpu_s_median": round(statistics.median(reduce_cpu), 4) if reduce_cpu else None,
            "first_judgement_cpu_s": round(first_cpu, 4), "cpu_s_median": round(median, 4),
            "cpu_s_mean": round(statistics.mean(cpu), 4),
            "cpu_s_min": round(min(cpu), 4), "cpu_s_max": round(max(cpu), 4),
            "interval_s": round(spaced_s, 2), "cpu_share_at_interval": round(median / spaced_s, 4),
            **{f"cpu_share_every_{i:g}s": round(median / i, 4) for i in FIXED_INTERVALS_S},
            "bytes_read_per_judgement": int(statistics.median(read)),
            # The straggler is slow from step 1; live judgement starts once a window of steps is in.
            "straggler_found_at_step": found_at, "first_judgement_at_step": settings.window_steps,
            "warnings_found": sorted(f"{k} on {list(r)}" for k, r in kinds), "cpu_s": [round(c, 4) for c in cpu]}


def time_to_finding(ranks: int, step_s: float = 1.0) -> dict:
    """Steps from a straggler's first slow step to the live verdict naming it (warning or worse), every host
    reducing and the judge judging after each step; and that in seconds for a job of ``step_s`` steps, plus a host's
    reduce round and the judge's spacing at this cost (the most either can add)."""
    settings = Live.active()
    start = settings.window_steps + 5
    with tempfile.TemporaryDirectory() as tmp:
        job = SyntheticJob(Path(tmp), ranks, straggler_from=start)
        index = RankIndex(Path(tmp))
        hosts = [HostReducer(Path(tmp), host_of(r), index) for r in range(0, ranks, RANKS_PER_HOST)]
        judge, cpu = LiveJudge(Path(tmp)), []
        job.append(start - 1)
        _reduce(hosts)
        _judged(judge, job.clock)
        while job.step < start + 3 * settings.window_steps:
            job.append()
            _reduce(hosts)
            began = time.process_time()
            named = _straggler_named(_judged(judge, job.clock).active)
            cpu.append(time.process_time() - began)
            if named:
                break
    steps = job.step - start + 1 if named else None
    spacing = max(settings.interval_s, statistics.median(cpu) / settings.max_cpu_share)
    return {"ranks": ranks, "straggler_from_step": start, "steps_to_finding": steps, "step_s": step_s,
            "seconds_to_finding_at_most": round(steps * step_s + settings.interval_s + spacing, 1) if steps else None}


def from_start(ranks: int, extra_steps: int = 10) -> dict:
    """The wrapper's own flow: the judge judges after every step from the job's first, every host reducing
    before it; the CPU of each judgement. The first pays the imports and the first read; the window then grows
    to ``window_steps`` steps, and each later judgement reads one step of every rank."""
    settings = Live.active()
    with tempfile.TemporaryDirectory() as tmp:
        job = SyntheticJob(Path(tmp), ranks)
        index = RankIndex(Path(tmp))
        hosts = [HostReducer(Path(tmp), host_of(r), index) for r in range(0, ranks, RANKS_PER_HOST)]
        judge, cpu, first_finding = LiveJudge(Path(tmp)), [], None
        while job.step < settings.window_steps + extra_steps:
            job.append()
            _reduce(hosts)
            began = time.process_time()
            verdict = _judged(judge, job.clock)
            cpu.append(time.process_time() - began)
            if first_finding is None and verdict.active:
                first_finding = job.step  # the first judgement whose detectors ran and found something
    full = cpu[settings.window_steps:]  # judgements of a full window
    return {"ranks": ranks, "cpu_s": [round(c, 4) for c in cpu], "first_judgement_cpu_s": round(cpu[0], 4),
            "first_finding_at_step": first_finding,
            "first_finding_cpu_s": round(cpu[first_finding - 1], 4) if first_finding else None,
            "most_before_full_window_cpu_s": round(max(cpu[1:settings.window_steps]), 4),
            "full_window_cpu_s_median": round(statistics.median(full), 4)}


def _section(title: str, intro: str, columns: list[str], rows: list[str]) -> str:
    """A markdown section of right-aligned columns, nothing without rows."""
    if not rows:
        return ""
    lines = ["", f"## {title}", "", intro, "", f"| {' | '.join(columns)} |", f"|{' ---: |' * len(columns)}", *rows]
    return "\n".join(lines) + "\n"


def from_start_markdown(rows: list[dict]) -> str:
    return _section(
        "Judged from the job's first step",
        "The wrapper's own flow: the judge runs from the job's start, judging after every step (every host reducing "
        "before it), so no judgement reads more than the steps since the one before. *First*: step 1's judgement, "
        "with the judge's imports and first read. *First finding*: the first judgement past warm-up that named "
        "something (its detectors' first run). *Most before a full window*: the dearest judgement while the window "
        "grows to its steps. *Full window*: the median of the judgements after it.",
        ["ranks", "first judgement CPU s", "first finding at step", "its CPU s", "most before a full window",
         "full window, median CPU s"],
        [f"| {r['ranks']} | {r['first_judgement_cpu_s']} | {r['first_finding_at_step'] or '-'} | "
         f"{r['first_finding_cpu_s'] if r['first_finding_cpu_s'] is not None else '-'} | "
         f"{r['most_before_full_window_cpu_s']} | {r['full_window_cpu_s_median']} |" for r in rows])


def _judged(judge: LiveJudge, now: float) -> Any:
    """One judgement as the wrapper makes it (cli/run.py): the judge's verdict, then what it holds spared the
    collector's passes where it read new ranks (older code, measured with ``--before``, has no such step)."""
    verdict = judge.judge(now=now)
    getattr(judge, "spare_readers", lambda: None)()
    return verdict


def _reduce(hosts: list[HostReducer]) -> list[float]:
    """Each host's reduction of its ranks' new records (as its own wrapper would, on its own CPU): its CPU s."""
    spent = []
    for host in hosts:
        started = time.process_time()
        host.reduce()
        spent.append(time.process_time() - started)
    return spent


def _straggler_named(active: list[dict]) -> bool:
    return any(f["kind"] == "straggler" and f["ranks"] == [STRAGGLER] and f["severity"] != "info" for f in active)


def in_turns(before: Path, ranks: list[int], reps: int, rounds: int, way: str = "reduced") -> dict[str, list[dict]]:
    """Each rank count measured by the older code and by this code in turns, in fresh processes, the judge reading
    the records ``way`` (one way: a process measuring both would report the last); per code, one row per rank
    count over all its rounds' judgements."""
    code = {"before": str(before), "after": ""}  # "": no PYTHONPATH, the installed (this) diagtrain
    found: dict[str, dict[int, list[dict]]] = {name: {n: [] for n in ranks} for name in code}
    for _ in range(rounds):
        for n in ranks:
            for name, path in code.items():
                out = subprocess.run([sys.executable, __file__, "--ranks", str(n), "--reps", str(reps), "--no-save",
                                      "--ways", way], capture_output=True, text=True, check=True,
                                     env={**os.environ, "PYTHONPATH": path})
                found[name][n].append(json.loads(out.stdout.strip().splitlines()[-1]))
                print(name, json.dumps({k: v for k, v in found[name][n][-1].items() if k != "cpu_s"}), flush=True)
    return {name: [_pooled(rows) for rows in by_ranks.values()] for name, by_ranks in found.items()}


def _pooled(rows: list[dict]) -> dict:
    """One row from several rounds' rows of one rank count: the statistics of all their judgements."""
    settings = Live.active()
    cpu = [c for r in rows for c in r["cpu_s"]]
    median = statistics.median(cpu)
    spaced_s = max(settings.interval_s, median / settings.max_cpu_share)
    return {**rows[0], "reps": len(cpu), "rounds": len(rows), "cpu_s": cpu,
            "first_judgement_cpu_s": round(statistics.median(r["first_judgement_cpu_s"] for r in rows), 4),
            "cpu_s_median": round(median, 4), "cpu_s_mean": round(statistics.mean(cpu), 4),
            "cpu_s_min": round(min(cpu), 4), "cpu_s_max": round(max(cpu), 4),
            "round_medians": [r["cpu_s_median"] for r in rows],
            "interval_s": round(spaced_s, 2), "cpu_share_at_interval": round(median / spaced_s, 4),
            **{f"cpu_share_every_{i:g}s": round(median / i, 4) for i in FIXED_INTERVALS_S}}


def markdown(sections: dict[str, list[dict]], facts: dict, settings: Live) -> str:
    lines = ["# Live judgement: the wrapper's CPU per judgement", "",
             f"{facts['date']}, {facts['cpu_count']} cores, load {facts['load_average_1_5_15']}, `{facts['command']}`", "",
             f"Synthetic step records (a straggler on rank {STRAGGLER}, +{STRAGGLER_MS:g} ms forward a step), "
             f"{settings.window_steps} steps judged; one judgement after every rank appended a step, "
             "CPU by time.process_time. Interval: live.interval_s "
             f"({settings.interval_s:g} s), spaced to CPU / live.max_cpu_share ({settings.max_cpu_share:g}). "
             "Target (issue 39): under 2% of a core at 64 ranks.", "",
             "Target (issue 53): at most 0.3 s at 1,024 ranks (one judgement every 15 s at 2% of a core). *bytes read*: "
             "the step records appended since the judgement before, which is what it reads (each file from where it "
             "stopped). *straggler found at step*: the step every rank had finished when the live verdict first named "
             f"it (it is slow from step 1; judgement starts once {settings.window_steps} steps are in).", "",
             "| code | ranks | judgements | CPU s median | mean | min | max | first judgement CPU s | interval s | "
             "CPU share there | share every 2 s | share every 5 s | bytes read per judgement | straggler found at step "
             "| warnings found |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for name, r in ((name, r) for name, rows in sections.items() for r in rows):
        lines.append(f"| {name} | {r['ranks']} | {r['reps']} | {r['cpu_s_median']} | {r.get('cpu_s_mean', '-')} | {r['cpu_s_min']} | {r['cpu_s_max']} | "
                     f"{r['first_judgement_cpu_s']} | {r['interval_s']} | {r['cpu_share_at_interval']:.1%} | "
                     f"{r['cpu_share_every_2s']:.1%} | {r['cpu_share_every_5s']:.1%} | "
                     f"{r.get('bytes_read_per_judgement', 0):,} | {r.get('straggler_found_at_step') or '-'} | "
                     f"{'; '.join(r['warnings_found']) or 'none'} |")
    return "\n".join(lines) + "\n"


def finding_markdown(found: list[dict]) -> str:
    return _section(
        "From a straggler's first step to its live finding",
        "Rank 1 turns slow (+60 ms forward) at the step shown; every host reduces and the judge judges after each "
        "step. *Seconds, at most*: those steps at the step time shown, plus a host's reduce round "
        "(live.interval_s) and the judge's spacing at its CPU per judgement (the most either can add).",
        ["ranks", "slow from step", "steps to its finding", "step time s", "seconds, at most"],
        [f"| {r['ranks']} | {r['straggler_from_step']} | {r['steps_to_finding'] or 'not found'} | {r['step_s']:g} | "
         f"{r['seconds_to_finding_at_most'] or '-'} |" for r in found])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--profile", type=int, nargs="*", default=[], help="cProfile the judgements of these rank counts")
    parser.add_argument("--name", default="live_cost", help="results/<name>.md and .json")
    parser.add_argument("--no-save", action="store_true")
    parser.add_argument("--before", type=Path, help="measure this older code too, in turns (see above)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--time-to-finding", type=int, nargs="*", default=[],
                        help="also measure the steps from a straggler's first slow step to its live finding at these ranks")
    parser.add_argument("--from-start", type=int, nargs="*", default=[],
                        help="also judge these rank counts after every step from the job's first, as the wrapper does")
    parser.add_argument("--ways", nargs="+", choices=list(WAYS), default=list(WAYS),
                        help="reduced: each host's wrapper summarizes its ranks, the judge reads one file a host; "
                             "direct: the judge reads every rank's steps.jsonl")
    args = parser.parse_args()
    settings = Live.active()
    started = []  # first: its first judgement pays the judge's imports, as a wrapper's does
    for n in args.from_start:
        started.append(from_start(n))
        print(json.dumps({k: v for k, v in started[-1].items() if k != "cpu_s"}), flush=True)
    if args.before:
        if len(args.ways) != 1:
            parser.error("--before measures one way at a time: give --ways reduced or --ways direct")
        sections = in_turns(args.before, args.ranks, args.reps, args.rounds, args.ways[0])
    else:
        sections = {WAYS[way]: [] for way in args.ways}
        for ranks in args.ranks:
            for way in args.ways:
                sections[WAYS[way]].append(measure(ranks, args.reps, ranks in args.profile, way == "reduced"))
                row = sections[WAYS[way]][-1]
                # Unsaved, every judgement's CPU too: in_turns pools the rounds' judgements from this line.
                print(json.dumps(row if args.no_save else {k: v for k, v in row.items() if k != "cpu_s"}), flush=True)
    found = [time_to_finding(n) for n in args.time_to_finding]
    for row in found:
        print(json.dumps(row), flush=True)
    facts = machine()
    if not args.no_save:
        save(args.name, {"machine": facts, "settings": {"interval_s": settings.interval_s,
                                                        "max_cpu_share": settings.max_cpu_share,
                                                        "window_steps": settings.window_steps}, "results": sections,
                         "time_to_finding": found, "from_start": started},
             markdown(sections, facts, settings) + finding_markdown(found) + from_start_markdown(started))


if __name__ == "__main__":
    main()
