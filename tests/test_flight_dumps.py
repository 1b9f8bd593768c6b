"""Flight-recorder dumps as production leaves them: a folder of NCCL's dumps alone, and collectives whose
sizes differ per rank by design, recorded here by real gloo runs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import diagtrain_run, torchrun
from diagtrain.dashboard import app as dashboard_app
from diagtrain.dashboard import data as dashboard_data
from diagtrain.dashboard import hang as dashboard_hang
from diagtrain.profiler.analyzer.read import flight_records as fr
from public_fixtures import NVRX_GPU_ERROR_1ST

DUMPS = NVRX_GPU_ERROR_1ST
USAGE = 2


def analyze(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "diagtrain.profiler.cli", "analyze", *args, "--quiet"],
                          capture_output=True, text=True, timeout=300)


def test_shared_dumps_exist():
    # The corpus is part of the suite: without it the tests below would say nothing.
    assert len(list(DUMPS.glob("_dump_*"))) == 16


@pytest.mark.jobs
@pytest.mark.parametrize("how", ["alone", "inside an empty run"])
def test_a_folder_of_nccl_dumps_names_the_rank_that_never_entered(tmp_path, how):
    # nvidia-resiliency-ext's job: a GPU error injected on ranks 12 and 14; its analyzer (and fr_trace) name
    # rank 12 as missing from the expert-parallel all_to_all the others entered first.
    if how == "alone":
        proc = analyze(str(DUMPS), "--out", str(tmp_path / "out"))
    else:
        (tmp_path / "run").mkdir()
        proc = analyze(str(tmp_path / "run"), "--flight-recorder", str(DUMPS), "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    kinds = [f["kind"] for f in report["findings"]]
    assert "collective_mismatch" not in kinds  # the all_to_all's sizes differ by token routing
    [hang] = [f for f in report["findings"] if f["kind"] == "hang"]
    assert hang["ranks"][0] == 12 and set(hang["ranks"]) <= {12, 14}
    assert hang["metrics"]["op"] == "nccl:all_to_all" and hang["metrics"]["group"] == "EXPERT_MODEL_PARALLEL_GROUP"
    assert hang["metrics"]["waiting"] == [13, 14, 15]
    # Its other groups' blocked collectives are told as consequences of the first, not as faults.
    assert len(hang["metrics"]["later_blocked"]) == 4 and all(x["missing"] == [12] for x in hang["metrics"]["later_blocked"])
    assert "completed up to #20529" in hang["explanation"]  # from pg_status: its GPU stopped finishing work
    assert "never completed on its device" in hang["suggestion"]
    assert report["run"]["dumps"] == 16
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "flight-recorder dumps of 16 ranks alone" in markdown
    assert "fault_injection.log`: not a flight-recorder dump" in markdown
    hang_doc = json.loads((tmp_path / "out" / "analysis" / "hang.json").read_text())
    assert hang_doc["blocked"][0]["seq"] == 20537
    # The dashboard's Hang tab leads with the same collective.
    board_run = dashboard_data.load(tmp_path / "out")
    rows, _ = dashboard_hang.flight_recorder(board_run)
    assert (rows[0]["group"], rows[0]["seq"], rows[0]["missing"]) == ("EXPERT_MODEL_PARALLEL_GROUP", 20537, "12")
    board = dashboard_app.Dashboard([board_run])
    assert all(board.render_tab(tab, 0) is not None for tab, _ in dashboard_app.TABS)  # no steps, no traces: no crash


@pytest.mark.jobs
def test_a_folder_with_neither_run_traces_nor_dumps_is_a_usage_error(tmp_path):
    (tmp_path / "notes.txt").write_text("nothing here\n")
    proc = analyze(str(tmp_path))
    assert proc.returncode == USAGE and "no flight-recorder dumps" in proc.stderr and str(tmp_path) in proc.stderr


def test_dump_groups_are_read_from_nccls_string_rank_lists():
    dump = fr.read_dump(DUMPS / "_dump_12")
    groups = fr.groups_of_dump(dump)
    assert groups["74"] == {"desc": "EXPERT_MODEL_PARALLEL_GROUP", "ranks": [12, 13, 14, 15]}
    assert fr.wrapped(dump)  # 27 entries left of tens of thousands: a group without one says nothing


def entry(rank: int, op: str, sizes: list, out: list | None = None, dtype: str = "Float", seq: int = 1) -> fr.Entry:
    return fr.Entry(rank=rank, pg="0:0-2", pg_desc="default_pg", seq=seq, op=op, sizes=sizes, dtypes=[dtype],
                    created_ns=rank, state="completed", out_sizes=out)


def test_sizes_must_agree_only_where_the_collective_requires_it():
    members = {"0:0-2": [0, 1, 2]}
    uneven = [[3 + r] for r in range(3)]
    # Sizes that differ per rank by design.
    for op in ("gloo:all_to_all", "nccl:all_gather", "nccl:reduce_scatter", "gloo:gather"):
        assert fr.mismatches([entry(r, op, [s]) for r, s in enumerate(uneven)], members) == [], op
    # Sizes that must agree.
    for op in ("nccl:all_reduce", "nccl:_all_gather_base", "nccl:broadcast", "nccl:_reduce_scatter_base"):
        [m] = fr.mismatches([entry(r, op, [s]) for r, s in enumerate(uneven)], members)
        assert m.seq == 1 and sorted(m.versions) == [0, 1, 2], op
    # A dtype or an op that differs is a mismatch whatever the op.
    assert fr.mismatches([entry(0, "nccl:all_to_all", [[4]]), entry(1, "nccl:all_to_all", [[4]], dtype="BFloat16")])
    assert fr.mismatches([entry(0, "nccl:all_to_all", [[4]]), entry(1, "nccl:all_reduce", [[4]])])
    # An all_to_all must receive, summed over its members, what they sent (fr_trace's check).
    balanced = [entry(0, "nccl:all_to_all", [[4]], [[2]]), entry(1, "nccl:all_to_all", [[2]], [[3]]),
                entry(2, "nccl:all_to_all", [[3]], [[4]])]
    assert fr.mismatches(balanced, members) == []
    balanced[2].out_sizes = [[5]]
    assert fr.mismatches(balanced, members)


UNEVEN = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
for step in range(3):
    # rank r sends r+1 elements to every peer and receives from peer p p+1: every rank's sizes differ
    send = torch.ones((rank + 1) * world)
    recv = torch.empty(sum(p + 1 for p in range(world)))
    dist.all_to_all_single(recv, send, [p + 1 for p in range(world)], [rank + 1] * world)
    dist.gather(torch.ones(2), [torch.empty(2) for _ in range(world)] if rank == 0 else None, dst=0)
    dist.scatter(torch.empty(2), [torch.ones(2) for _ in range(world)] if rank == 0 else None, src=0)
    dist.all_reduce(torch.ones(4))
dist.destroy_process_group()
"""


@pytest.mark.jobs
def test_collectives_with_per_rank_sizes_recorded_by_gloo_are_no_mismatch(tmp_path):
    script = tmp_path / "uneven.py"
    script.write_text(UNEVEN)
    run = diagtrain_run(tmp_path / "run", "--profile-steps", "none", "--no-analyze", "--", *torchrun(2), str(script))
    dumps = {r: fr.read_dump(run.out / "ranks" / str(r) / "flight_recorder.json") for r in (0, 1)}
    found = [e for r, d in dumps.items() for e in fr.entries(r, d)]
    to_all = [e for e in found if fr.op_name(e.op) in fr.ALL_TO_ALL]
    assert to_all and len({str(e.sizes) for e in to_all if e.seq == to_all[0].seq}) == 2  # really uneven
    assert {fr.op_name(e.op) for e in found} >= {"gather", "scatter", "all_reduce"} | {fr.op_name(to_all[0].op)}
    proc = analyze(str(run.out))
    assert proc.returncode == 0, proc.stderr
    report = json.loads((run.out / "report.json").read_text())
    assert not [f for f in report["findings"] if f["kind"] in ("collective_mismatch", "hang")]


def json_dump(rank: int, seqs: list[int], version: str) -> dict:
    entries = [{"record_id": i, "pg_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": s,
                "profiling_name": "nccl:all_reduce", "time_created_ns": 1_790_000_000_000_000_000 + s * 1000 + rank,
                "input_sizes": [[8]], "input_dtypes": ["Float"], "state": "scheduled", "is_p2p": False}
               for i, s in enumerate(seqs)]
    return {"version": version, "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
            "entries": entries}


@pytest.mark.jobs
def test_json_dumps_of_an_unknown_version_are_read_and_say_so(tmp_path):
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    (dumps / "rank_0").write_text(json.dumps(json_dump(0, [1, 2, 3], "3.1")))
    (dumps / "rank_1").write_text(json.dumps(json_dump(1, [1, 2], "3.1")))
    proc = analyze(str(dumps), "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    [hang] = [f for f in report["findings"] if f["kind"] == "hang"]
    assert hang["ranks"] == [1] and hang["metrics"]["seq"] == 3 and hang["metrics"]["waiting"] == [0]
    notes = json.dumps(report["health"]) + json.dumps(report["skipped"])
    assert "version '3.1'" in notes and "rank_1" in notes
