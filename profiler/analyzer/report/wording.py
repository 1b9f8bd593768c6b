"""A finding's words: what its proposer saw, then what each later judgement said of it, and what to do.

Judgement (judge/) leaves only data: a candidate's facts (``Finding.facts``, worded per kind by report/words/) and
each assessment's remark (``Finding.remarks``: ``{"says": <what>, ...its values}``, worded by ``PHRASES``). The
text is composed here, once, for report.json, report.md, the live verdict and the terminal alike.
"""

from __future__ import annotations

from typing import Any, Callable

from diagtrain.profiler.analyzer.judge.assessments.ledger_price import EVERY_STEP
from diagtrain.profiler.analyzer.judge.findings import SEVERITIES, UPPER_BOUND, Finding
from diagtrain.profiler.analyzer.judge.live_judge import AGAIN, ENDED, STARTED, LiveEvent, LiveVerdict
from diagtrain.profiler.analyzer.report.words import Words, said
from diagtrain.profiler.analyzer.report.words import (contention, dataloader_stall, exposed_communication,
                                                      gpu_throttling, hang, host_contention, input_bound, ledger_price,
                                                      live, low_utilization, memory_growth, memory_imbalance,
                                                      missing_evidence, model_check, nccl_transport, periodic_stall,
                                                      pipeline_bubble, slow_collective, slow_startup, straggler)
from diagtrain.profiler.util.text import ranges

# Every proposer's words, by kind (or ``kind/case``): the detectors' in the order they run, the model check's, live
# judgement's, and those of the assessments that name a cause no detector did.
WORDS: dict[str, Words] = {
    key: words
    for module in (hang, straggler, dataloader_stall, memory_imbalance, pipeline_bubble, slow_collective,
                   exposed_communication, nccl_transport, gpu_throttling, low_utilization, host_contention,
                   memory_growth, missing_evidence, input_bound, periodic_stall, slow_startup, model_check, live,
                   ledger_price, contention)
    for key, words in module.WORDS.items()}


def explanation(finding: Finding) -> str:
    """The finding's whole explanation: its own words, then its remarks' in the order they were made."""
    return _explanation(_said_of(finding))


def suggestion(finding: Finding) -> str:
    """What to do about the finding."""
    return _suggestion(_said_of(finding))


def finding_json(finding: Finding) -> dict[str, Any]:
    """The finding's report.json record: its whole explanation and its suggestion, and its metrics and remarks
    worded where judgement left data that report.json holds in words."""
    record = finding.to_json()
    return {**record, "explanation": _explanation(record), "suggestion": _suggestion(record),
            "metrics": metrics_json(record["metrics"]), "remarks": [remark_json(r) for r in record["remarks"]]}


def metrics_json(metrics: dict[str, Any]) -> dict[str, Any]:
    """A finding's metrics as report.json and the live records hold them: those judgement left as data that they
    hold in words (``METRIC_WORDS``) worded, the others as made."""
    return {k: METRIC_WORDS[k](v) if k in METRIC_WORDS and isinstance(v, dict) else v for k, v in metrics.items()}


def remark_json(remark: dict[str, Any]) -> dict[str, Any]:
    """A remark as report.json and the live records hold it: a not_own_work remark's evidence in words (its
    ``reason``), the others as made."""
    if remark.get("says") != "not_own_work" or "evidence" not in remark:
        return remark
    return {"says": remark["says"], "cause": remark["cause"], "rank": remark["rank"], "reason": _reason(remark)}


def worded(verdict: LiveVerdict) -> LiveVerdict:
    """A live judgement whose records (its events and the findings standing) carry their whole explanation and
    suggestion and, as report.json, their remarks and metrics in words, its events their console lines, and the
    warnings and worse standing a line each."""
    for record in [*(e.record for e in verdict.events), *verdict.active]:
        record["explanation"], record["suggestion"] = _explanation(record), _suggestion(record)  # from the raw remarks
        if "remarks" in record:
            record["remarks"] = [remark_json(r) for r in record["remarks"]]
        if "metrics" in record:
            record["metrics"] = metrics_json(record["metrics"])
    for e in verdict.events:
        e.line = live_line(e)
    verdict.standing = standing_lines(verdict.active)
    return verdict


def live_line(event: LiveEvent) -> str | None:
    """A live event's console line: ``live: WARNING started straggler on rank 1 since step 25: 0.6 s lost so far``."""
    r = event.record
    if event.say == ENDED:
        lost = f"; {event.lost_ms / 1e3:.1f} s lost" if event.lost_ms > 0 else ""
        return f"live: ended: {_what(r)} (since step {r['since_step']}{lost})"
    if event.say in (STARTED, AGAIN):
        lost = f": {event.lost_ms / 1e3:.1f} s lost so far" if event.lost_ms > 0 else ""  # memory growth costs no time
        start = "started " if event.say == STARTED else ""
        return f"live: {r['severity'].upper()} {start}{_what(r)} since step {r['since_step']}{lost}"
    return None


def standing_lines(active: list[dict[str, Any]]) -> list[str]:
    """The warnings and worse standing, worst first, a line each: what the progress view shows while the job runs."""
    found = sorted((f for f in active if SEVERITIES.index(f.get("severity", "info")) >= SEVERITIES.index("warning")),
                   key=lambda f: -SEVERITIES.index(f["severity"]))
    return [f"{f['severity'].upper()} {f['kind']} on rank{'s' if len(f['ranks']) > 1 else ''} {ranges(f['ranks'])} "
            f"since step {f.get('since_step')}, {f.get('lost_s_so_far', 0.0):.1f} s lost so far" for f in found]


def _what(record: dict[str, Any]) -> str:
    ranks = record.get("ranks") or []
    who = f"rank{'s' if len(ranks) > 1 else ''} {ranges(ranks)}" if ranks else "the job"
    return f"{record['kind']} on {who}"


def saving_text(finding: dict[str, Any]) -> str:
    """``~12.3 ms/step`` or ``up to 12.3 ms/step`` for a finding's JSON record; '' when it claims no saving."""
    if not finding.get("impact_ms"):
        return ""
    disputed = (finding.get("metrics") or {}).get("impact_range_ms")
    if disputed:  # two measurements of it disagree: the range, not a number nobody can stand behind
        return f"{disputed[0]:.1f}-{disputed[1]:.1f} ms/step"
    bound = "up to " if (finding.get("metrics") or {}).get(UPPER_BOUND) else "~"
    return f"{bound}{finding['impact_ms']:.1f} ms/step"


def _said_of(finding: Finding) -> dict[str, Any]:
    """What a finding's words are made of, as its JSON record holds it (without the copy of the rest it makes)."""
    return {"kind": finding.kind, "ranks": finding.ranks, "steps": finding.steps, "facts": finding.facts,
            "remarks": finding.remarks}


def _explanation(record: dict[str, Any]) -> str:
    own = said(_words(record).explanation, _facts(record))
    return " ".join(t for t in (own, *(PHRASES[r["says"]](r) for r in record["remarks"])) if t)


def _suggestion(record: dict[str, Any]) -> str:
    return said(_words(record).suggestion, _facts(record))


def _facts(record: dict[str, Any]) -> dict[str, Any]:
    """What a kind's words are made of: the finding's facts, and where it is (its ranks and steps: a long run's
    hundreds of thousands of steps are not copied into its facts)."""
    return {"ranks": record["ranks"], "steps": record["steps"], **record["facts"]}


def _words(record: dict[str, Any]) -> Words:
    """The words of a finding's kind, in the case its facts name."""
    case = record["facts"].get("case")
    return WORDS[f"{record['kind']}/{case}" if case else record["kind"]]


def _ledger_price(r: dict[str, Any]) -> str:
    when = ("in every step" if r["pattern"] == EVERY_STEP else
            f"{r['pattern']} (steps {r['step_ranges']})" if r["periodic"] else f"in steps {r['step_ranges']}")
    if r.get("onset") is not None:
        blips = r.get("blips") or 0
        when += f" since step {r['onset']}" + (
            f" (before it, {blips} step{'s' if blips > 1 else ''} charged now and then: a busy host's pauses, left out)"
            if blips else "")
    words = _cost_words("the run", r, when) + "."
    if "cpu_bound_ms" in r:
        words += (f" Its host had fewer free CPUs than ranks, and the job's CPU work fills most of those steps: while "
                  f"this rank is held up its peers use its CPU, so removing the cause would save at most "
                  f"{r['cpu_bound_ms']:.1f} ms per step here (with a CPU for every rank, {r['ledger_impact_ms']:.1f} ms).")
    if "host_ranks" in r:
        words += (f" Its host ran {r['host_ranks']} ranks on {r['host_cpus']} CPUs: removing the cause saves at most "
                  "this much there, and how much less depends on how the ranks share the CPUs it holds up or frees.")
    return words


def _job_price(r: dict[str, Any]) -> str:
    if r["once"]:
        return f"It cost the job {r['lost_ms'] / 1e3:.2f} s of its {r['job_s']:.2f} s ({r['share']:.0%})."
    when = "in every step" if r["pattern"] == EVERY_STEP else f"{r['pattern']} (steps {r['step_ranges']})"
    return _cost_words("the steady steps", r, when) + ", on every rank at once."


def _cost_words(over: str, r: dict[str, Any], when: str) -> str:
    """``Over the run it cost the job 1.20 s of 4.00 s (30%), 60.0 ms per step on average, in every step``."""
    return (f"Over {over} it cost the job {r['lost_ms'] / 1e3:.2f} s of {r['job_s']:.2f} s ({r['share']:.0%}), "
            f"{r['lost_ms'] / r['steady_steps']:.1f} ms per step on average, {when}")


def _ledger_charged_nothing(r: dict[str, Any]) -> str:
    return (f"But the ledger of every step charged rank {r['rank']} nothing above this run's noise "
            f"({r['charged_above_ms']:.1f} ms a step): seen in profiled steps alone, it cost the job nothing measurable.")


# What each kind of time that was not the rank's own work is (judge/assessments/contention.py names the kind).
NOT_OWN_WORK = {
    "starved": "that is host contention (see host_contention), not rank {rank}'s own work",
    "memory_churn": "the same work done more slowly, not more work (a steady allocator, e.g. jemalloc or tcmalloc, "
                    "or MALLOC_MMAP_THRESHOLD_ set high, keeps the memory)",
    "leak_cost": "the time its memory growth costs: fixing that (see memory_growth) saves this too",
    "busy_host": "pauses a busy host gives any rank, not a rank slower at every step",
}


def _not_own_work(r: dict[str, Any]) -> str:
    return f"But {_reason(r)}: {NOT_OWN_WORK[r['cause']].format(rank=r['rank'])}."


def _reason(r: dict[str, Any]) -> str:
    """What showed that a rank's excess was not its own work (judge/assessments/contention.py's evidence), in words;
    a record already worded (report.json's) keeps its reason."""
    return r["reason"] if "evidence" not in r else EVIDENCE[r["evidence"]](r)


def _others(r: dict[str, Any]) -> str:
    """`` (python (pid 4242) 97%, ...)``: the other processes a host's load named, busiest first ('' for none)."""
    named = ", ".join(f"{p['name']} (pid {p['pid']}) {p['cpu_percent']:.0f}%" for p in r.get("processes") or [])
    return f" ({named})" if named else ""


# What showed that a rank's excess was not its own work, by its evidence (judge/assessments/contention.py).
EVIDENCE: dict[str, Callable[[dict[str, Any]], str]] = {
    "cpu_wait": lambda r: f"it waited {r['extra_ms']:.1f} ms per step longer than its peers for a CPU",
    "saturated_host": lambda r: (f"its host's CPUs were saturated by other processes then{_others(r)} and its own "
                                 "CPU time was not higher"),
    "churn": lambda r: (f"its extra time was CPU time of its own, for the same samples as its peers, with "
                        f"{r['faults'] - r['peer_faults']:,.0f} more page faults per step than they took "
                        f"({r['faults']:,.0f} vs {r['peer_faults']:,.0f}, {r['extra_mib']:,.0f} MiB); its memory "
                        "allocator gives memory back to the kernel and faults it in again every step"),
    "leak": lambda r: (f"its extra time was CPU time of its own, for the same samples as its peers, faulting in "
                       f"{r['extra_mib']:,.0f} MiB a step more than they did while its resident memory grew "
                       f"{r['kept_bytes'] / 2**20:,.1f} MiB a step"),
    "intermittent": lambda r: (f"it was slow in only {r['slow_steps']} of the {r['steps_seen']} steps it was seen "
                               f"in, on a host whose CPUs other processes kept busy{_others(r)}"),
}


def _more_work(r: dict[str, Any]) -> str:
    load = r.get("load")
    counted = (f" for {load[1] / load[2]:.1f}x their {load[0]} ({load[1]:,.0f} vs {load[2]:,.0f} a step)"
               if load and load[2] > 0 else "")
    return (f"Rank {r['rank']} does more work than its peers: {r['cpu_ms'] / r['peer_cpu_ms']:.2f}x their CPU time "
            f"per step ({r['cpu_ms']:.1f} vs {r['peer_cpu_ms']:.1f} ms){counted}. Its host runs {r['host_ranks']} ranks "
            f"on {r['host_cpus']} CPUs, where every rank waits for a CPU and that hides the cost; with a CPU per rank "
            f"it would make the others wait ~{r['estimate_ms']:.1f} ms a step ({r['share']:.0%} of a step), an "
            "estimate for such a host.")


def _leak_time(r: dict[str, Any]) -> str:
    return (f"It also costs the job {r['impact_ms']:.1f} ms a step: the pages it faults in hold up rank {r['rank']}'s "
            f"{r['phase']} (its straggler finding).")


def _traced_operators(r: dict[str, Any]) -> str:
    steps = f"traced step {r['steps'][0]}" if len(r["steps"]) == 1 else f"{len(r['steps'])} traced steps"
    where = _operators(r["parts"], "a sleep, I/O, a lock, or Python between operators")
    return f"In its {steps}, the traces put its excess over its peers, per step, {where}."


def _traced_stall(r: dict[str, Any]) -> str:
    steps = f"traced stall step {r['steps'][0]}" if len(r["steps"]) == 1 else f"{len(r['steps'])} traced stall steps"
    where = _operators(r["parts"], "file I/O, a sleep, garbage collection or Python between operators")
    return f"In its {steps}, the traces put the extra time, against the ranks' traced steps without a stall, {where}."


def _operators(parts: list[dict[str, Any]], outside: str) -> str:
    """``in aten::mm (+3.0 ms) and outside any operator (+1.0 ms: ...)``: where a traced excess went."""
    where = [f"in {p['op']} (+{p['ms']:.1f} ms)" if p["op"] is not None else
             f"outside any operator (+{p['ms']:.1f} ms: {outside})" for p in parts]
    return where[0] if len(where) == 1 else ", ".join(where[:-1]) + " and " + where[-1]


# The metrics judgement leaves as data that report.json holds in words (judge/assessments/price_check.py's).
METRIC_WORDS: dict[str, Callable[[dict[str, Any]], str]] = {
    "impact_replay_skipped": lambda m: (f"the critical path's graph models only {m['wait_coverage']:.0%} of the ranks' "
                                        "blocked time as waits; its what-if is no check of this price"),
    "impact_disputed": lambda m: (f"the critical path's what-if of the profiled steps says {m['replay_ms']:.1f} "
                                  f"ms/step, the step records' ledger {m['ledger_ms']:.1f} ms/step"),
}


# What each remark says, by its "says" (the judge's remarks: tests/test_verdict.py holds every one to a sentence).
PHRASES: dict[str, Callable[[dict[str, Any]], str]] = {
    "ledger_price": _ledger_price, "job_price": _job_price, "ledger_charged_nothing": _ledger_charged_nothing, "not_own_work": _not_own_work,
    "more_work": _more_work, "leak_time": _leak_time, "traced_operators": _traced_operators,
    "traced_stall": _traced_stall,
}
