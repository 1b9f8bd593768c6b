"""Structure inference and the always-on counters on inputs shaped like real run directories.

The multi-process runs of test_user_scripts.py check the inference end to end; these cover the
shapes no small CPU run produces: a 3D job's pipeline inside DeviceMesh subgroups, a ring of
sends that is not a pipeline, and the per-step counters of the steps.jsonl contract.
"""

from __future__ import annotations

import json
from pathlib import Path

from diagtrain.profiler.analyzer.analyze import analyze
from diagtrain.profiler.analyzer.per_rank.p2p import P2PCalls
from diagtrain.profiler.analyzer.run.structure import infer
from diagtrain.profiler.run_dir import write_json_atomic

T0 = 1_790_000_000.0


def mesh_groups(world: int, dims: dict[str, int]) -> dict[int, dict]:
    """process_groups.json of every rank of a DeviceMesh (outermost dimension first), as ranks write it."""
    names, strides, stride = list(dims), {}, 1
    for d in reversed(names):
        strides[d], stride = stride, stride * dims[d]
    out: dict[int, dict] = {r: {"0": {"desc": "default_pg", "ranks": list(range(world))}} for r in range(world)}
    next_name = 1
    for d in names:
        seen = set()
        for r in range(world):
            start = r - ((r // strides[d]) % dims[d]) * strides[d]
            ranks = [start + i * strides[d] for i in range(dims[d])]
            if tuple(ranks) in seen:
                continue
            seen.add(tuple(ranks))
            for member in ranks:
                out[member][str(next_name)] = {"desc": f"mesh_{d}", "ranks": ranks}
            next_name += 1
    return out


def pipeline_calls(stage: int, stages: int, microbatches: int) -> P2PCalls:
    """One rank's point-to-point calls in a pipeline over its pp group (peers are pp-group ranks)."""
    first = ["send", stage + 1] if stage == 0 else ["recv", stage - 1]
    sends = {p: float(microbatches) for p in (stage - 1, stage + 1) if 0 <= p < stages}
    return P2PCalls(first={s: first for s in (3, 4, 5)}, sends_per_step=sends, recvs_per_step=dict(sends))


def test_a_3d_job_pipeline_inside_mesh_subgroups():
    dims = {"pp": 2, "dp": 2, "tp": 2}
    groups = mesh_groups(8, dims)
    p2p = {r: pipeline_calls(r // 4, 2, 4) for r in range(8)}  # pp group of r: [r % 4, r % 4 + 4]
    s = infer(groups, {}, [], p2p, {}, None, 8)
    assert s.mesh == dims and s.coords[5] == {"pp": 1, "dp": 0, "tp": 1}
    assert s.stages == {r: r // 4 for r in range(8)} and s.stage_source == "point-to-point calls"
    assert s.microbatches == 4
    assert s.peer_groups(list(range(8))) == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_a_ring_of_sends_is_not_a_pipeline():
    # Ring attention style: every rank sends to the next and receives from the previous.
    p2p = {r: P2PCalls(first={3: ["send", (r + 1) % 4]}, sends_per_step={(r + 1) % 4: 2.0},
                       recvs_per_step={(r - 1) % 4: 2.0}) for r in range(4)}
    s = infer(mesh_groups(4, {"cp": 4}), {}, [], p2p, {}, None, 4)
    assert s.stages == {} and s.peer_groups([0, 1, 2, 3]) == [[0, 1, 2, 3]]


def test_trainer_json_is_one_source_among_others():
    trainer = {"mesh": {"pp": 2, "dp": 1, "tp": 1}, "n_microbatches": 8}
    s = infer({}, {}, [], {}, {}, trainer, 2)
    assert s.stages == {0: 0, 1: 1} and s.stage_source == "trainer.json" and s.microbatches == 8
    assert infer({}, {}, [], {}, {}, None, 2).stages == {}  # no pipeline without evidence of one


def nccl_pipeline_run(root: Path, blocked_ms: dict[int, float | list[float]] | None = None, steps: int = 5,
                      device_ms: float | None = None) -> Path:
    """An unprofiled 2-stage NCCL pipeline: steps.jsonl and the flight recorder's point-to-point
    entries ("nccl:send 0->1": group ranks), 4 microbatches per step, as torch writes them; with
    ``blocked_ms``, each rank's records carry the always-on counter of time blocked in communication
    (one value for every step, or one per step)."""
    for rank in (0, 1):
        folder = root / "ranks" / str(rank)
        folder.mkdir(parents=True)
        records, entries = [], []
        for step in range(1, steps + 1):
            start = T0 + step
            record = {"rank": rank, "step": step, "start": start, "end": start + 0.9, "duration_ms": 900.0,
                      "phases_ms": {"optimizer": 5.0}}
            if blocked_ms:
                blocked = blocked_ms[rank]
                record.update(comm_ms=blocked[step - 1] if isinstance(blocked, list) else blocked + step % 2, comm_calls=8)
            if device_ms is not None:  # a CUDA rank's device timing of the step (CUDA events, no p2p timing)
                record.update(device_source="cuda_events",
                              device_steps=[{"step": step, "step_ms": device_ms, "idle_before_ms": 0.5}])
            records.append(json.dumps(record))
            kinds = ["send 0->1"] * 4 + ["recv 0<-1"] * 4 if rank == 0 else ["recv 1<-0"] * 4 + ["send 1->0"] * 4
            entries += [{"record_id": len(entries), "pg_id": 0, "process_group": ["0", "default_pg"], "is_p2p": True,
                         "profiling_name": f"nccl:{k}", "collective_seq_id": 0, "p2p_seq_id": len(entries) + 1,
                         "time_created_ns": int((start + 0.1 * i) * 1e9), "state": "completed"}
                        for i, k in enumerate(kinds)]
        (folder / "steps.jsonl").write_text("\n".join(records) + "\n")
        write_json_atomic(folder / "flight_recorder.json", {"version": "2.10", "pg_config": {}, "entries": entries})
        write_json_atomic(folder / "process_groups.json", {"0": {"desc": "default_pg", "ranks": [0, 1]}})
    return root


def test_pipeline_stages_from_nccl_flight_recorder_dumps(tmp_path):
    report = analyze(nccl_pipeline_run(tmp_path), tmp_path, ["json"], workers=1)
    s = report["structure"]
    assert s["stages"] == {"0": 0, "1": 1} and s["stage_source"] == "point-to-point calls in the flight recorder"
    assert s["microbatches"] == 4
    [missing] = [f for f in report["findings"] if f["kind"] == "missing_evidence"]
    assert missing["metrics"]["check"] == "pipeline stage balance" and "--profile-steps" in missing["suggestion"]


def test_stage_balance_from_the_always_on_counters(tmp_path):
    # Stage 0 is blocked in communication 200 ms of its 900 ms step, stage 1 700 ms: stage 0 works
    # 700 ms, stage 1 200 ms. Absent counters would read as "no time blocked", never as these.
    report = analyze(nccl_pipeline_run(tmp_path, blocked_ms={0: 200.0, 1: 700.0}), tmp_path, ["json"], workers=1)
    [f] = [f for f in report["findings"] if f["kind"] == "pipeline_bubble"]
    assert f["severity"] == "warning" and f["ranks"] == [0] and f["metrics"]["bottleneck_stage"] == 0
    assert f["metrics"]["source"] == "time outside communication (counters)"
    assert f["metrics"]["work_per_stage"] == {0: 699.5, 1: 199.5}
    assert not [g for g in report["findings"] if g["kind"] == "missing_evidence"]


def test_on_cuda_ranks_the_hosts_time_blocked_in_send_recv_is_no_stage_balance(tmp_path):
    # The same counters as above, on ranks whose steps their GPUs timed: NCCL's send/recv return once queued,
    # so the host's blocked time says nothing of a stage's work, and point-to-point calls have no device timing.
    run = nccl_pipeline_run(tmp_path, blocked_ms={0: 200.0, 1: 700.0}, device_ms=890.0)
    report = analyze(run, tmp_path, ["json"], workers=1)
    assert not [f for f in report["findings"] if f["kind"] == "pipeline_bubble"
                and f["metrics"].get("source") == "time outside communication (counters)"]
    [missing] = [f for f in report["findings"] if f["kind"] == "missing_evidence"]
    assert missing["metrics"]["check"] == "pipeline stage balance"


def test_stages_ahead_of_each_other_by_turns_are_no_unequal_split(tmp_path):
    # Steady steps 2-5: stage 1 works 700 ms to stage 0's 300 in steps 2 and 3, then 280 and 700 ms to
    # 300 and 600: medians 700 and 300 (2.3x), but ahead by the ratio in 2 of 4 steps, as ranks sharing
    # a busy host take turns. A split that is unequal is so in every step (the test above).
    blocked = {0: [600.0, 600.0, 600.0, 600.0, 300.0], 1: [200.0, 200.0, 200.0, 620.0, 200.0]}
    report = analyze(nccl_pipeline_run(tmp_path, blocked_ms=blocked), tmp_path, ["json"], workers=1)
    [f] = [f for f in report["findings"] if f["kind"] == "pipeline_bubble"]
    assert f["metrics"]["work_per_stage"] == {0: 300.0, 1: 700.0} and f["metrics"]["observed_ratio"] >= 1.5
    assert f["severity"] == "info", f["explanation"]
    assert "in only 2 of 4 steps" in f["explanation"]


def test_two_steps_are_too_few_to_call_a_split_unequal(tmp_path):
    # A running job's first two steps (both kept as steady): stage 0 works 700 ms to stage 1's 200 in both.
    report = analyze(nccl_pipeline_run(tmp_path, blocked_ms={0: [200.0, 200.0], 1: [700.0, 700.0]}, steps=2),
                     tmp_path, ["json"], workers=1)
    [f] = [f for f in report["findings"] if f["kind"] == "pipeline_bubble"]
    assert f["severity"] == "info" and f["metrics"]["observed_ratio"] == 3.5, f["explanation"]
    assert "in all 2 steps timed: too few to tell" in f["explanation"]


def _written(groups: dict[int, dict], folder: Path, compact: bool) -> dict[int, dict]:
    """``groups`` written as every rank's process_groups.json (members as ranks write them now, or the ``ranks``
    lists of runs recorded before) and read back as the analysis reads them."""
    from diagtrain.profiler.analyzer.read.run_files import read_process_groups
    from diagtrain.profiler.run_dir import members_text

    read = {}
    for rank, mine in groups.items():
        doc = {name: {"desc": g["desc"], **({"members": members_text(g["ranks"])} if compact else {"ranks": g["ranks"]})}
               for name, g in mine.items()}
        path = folder / f"{rank}.json"
        write_json_atomic(path, doc)
        read[rank] = read_process_groups(path)
    return read


def test_members_written_as_ranges_read_as_the_lists_were(tmp_path):
    """A rank writes each group's members in a few characters ("0-63"): 64 ranks' files list the world's group
    in 4 bytes, not 64 numbers each; the structure read from them is the one read from lists, and the world's
    group is one tuple for every rank (the analysis holds it once, not once a rank)."""
    dims = {"pp": 2, "dp": 4, "tp": 8}
    groups = mesh_groups(64, dims)
    (tmp_path / "c").mkdir(), (tmp_path / "l").mkdir()
    compact, listed = _written(groups, tmp_path / "c", True), _written(groups, tmp_path / "l", False)
    assert json.loads((tmp_path / "c" / "5.json").read_text())["0"]["members"] == "0-63"
    assert all(compact[r] == listed[r] for r in range(64))
    assert compact[5]["0"]["ranks"] == tuple(range(64)) and compact[5]["0"]["ranks"] is compact[60]["0"]["ranks"]
    assert listed[5]["0"]["ranks"] is listed[60]["0"]["ranks"]
    a, b = infer(compact, {}, [], {}, {}, None, 64), infer(listed, {}, [], {}, {}, None, 64)
    assert a.mesh == b.mesh == dims and a.coords == b.coords and a.coords[13] == {"pp": 0, "dp": 1, "tp": 5}
    assert [(g.name, g.ranks) for g in a.groups] == [(g.name, g.ranks) for g in b.groups]


def test_a_ranks_process_groups_are_written_with_their_members_as_ranges(tmp_path):
    """What a real rank writes (torch.distributed with gloo, a group of one rank and the world of one)."""
    import torch.distributed as dist

    from diagtrain.profiler.analyzer.read.run_files import read_process_groups
    from diagtrain.profiler.rank.state_dump import write_process_groups

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        dist.new_group([0])
        write_process_groups(tmp_path)
    finally:
        dist.destroy_process_group()
    doc = json.loads((tmp_path / "process_groups.json").read_text())
    assert [g["members"] for g in doc.values()] == ["0", "0"] and all("ranks" not in g for g in doc.values())
    assert [g["ranks"] for g in read_process_groups(tmp_path / "process_groups.json").values()] == [(0,), (0,)]


def test_damaged_members_name_the_file_and_the_group(tmp_path):
    from diagtrain.profiler.analyzer.read.run_files import read_process_groups
    from diagtrain.profiler.util.bounded_read import InputError

    for members in ("0-x", "0-99999999", 7):
        write_json_atomic(tmp_path / "pg.json", {"3": {"desc": "dp", "members": members}})
        try:
            read_process_groups(tmp_path / "pg.json")
        except InputError as e:
            assert "pg.json" in str(e) and "group '3'" in str(e) and "'members'" in str(e)
        else:
            raise AssertionError(f"{members!r} was read")


def test_the_groups_kept_for_the_next_call_follow_the_ranks_entries():
    """The groups found in the ranks' process groups are kept while the same entries come again: a rank's entry
    added or replaced, another dict, or a group changed by its reader after a call are each seen."""
    world = 8
    groups = mesh_groups(world, {"dp": 2, "tp": 4})
    live = {r: groups[r] for r in range(4)}  # the ranks read so far: more come
    fresh = lambda: {r: json.loads(json.dumps(g)) for r, g in live.items()}  # the same entries, read anew
    first = infer(live, {}, [], {}, {}, None, world)
    assert first.to_json() == infer(fresh(), {}, [], {}, {}, None, world).to_json()
    first.groups[0].sources.append("a reader's")
    first.groups[0].ops.update(all_reduce=3)
    first.groups[0].desc = "changed"
    assert infer(live, {}, [], {}, {}, None, world).to_json() == infer(fresh(), {}, [], {}, {}, None, world).to_json()
    for rank in range(4, world):  # added in place
        live[rank] = groups[rank]
        assert infer(live, {}, [], {}, {}, None, world).to_json() == infer(fresh(), {}, [], {}, {}, None, world).to_json()
    live[5] = {"0": {"desc": "default_pg", "ranks": list(range(world))}, "9": {"desc": "mesh_pp", "ranks": [1, 5]}}
    assert infer(live, {}, [], {}, {}, None, world).to_json() == infer(fresh(), {}, [], {}, {}, None, world).to_json()
    assert any(g["desc"] == "mesh_pp" for g in infer(live, {}, [], {}, {}, None, world).to_json()["groups"])
    ops = {first.groups[0].key: {"all_reduce": 2}}  # the collectives seen on a group: each call's own
    traced = {0: [{"pg_name": "0", "pg_desc": "default_pg", "ranks": list(range(world))}]}
    assert infer(live, traced, [], {}, ops, None, world).groups[0].ops == {"all_reduce": 2}
    assert infer(live, traced, [], {}, ops, None, world).groups[0].sources == ["process_groups.json", "trace"]
    assert infer(live, {}, [], {}, {}, None, world).groups[0].sources == ["process_groups.json"]
    assert infer(live, {}, [], {}, {}, None, world).groups[0].ops == {}
