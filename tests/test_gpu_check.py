"""benchmarks/gpu_check.py without a GPU: it says so and exits 0, records every check as it goes, and compares each
collective op with the GPU work that op launched (issue 61)."""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import common  # noqa: E402
import gpu_check  # noqa: E402


@pytest.fixture
def results(tmp_path, monkeypatch):
    """The results folder, out of the checkout."""
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    monkeypatch.setattr(gpu_check, "RESULTS", tmp_path)
    return tmp_path


def test_without_a_gpu_it_says_what_it_would_check_and_exits_0(results, capsys):
    assert gpu_check.main([]) == 0
    said = capsys.readouterr().out
    assert "needs a CUDA GPU" in said and "whole-network CUDA graph capture" in said and "benchmarks/README.md" in said
    assert json.loads((results / "gpu_check.json").read_text())["status"] == gpu_check.NOT_RUN
    assert "1. A single-rank NCCL job" in (results / "gpu_check.md").read_text()


def test_the_results_are_written_after_every_check_whatever_fails(results, monkeypatch):
    written = []
    save = common.save

    def saving(name, result, markdown):
        written.append([c["check"] for c in result["checks"]])
        save(name, result, markdown)

    def broken(tmp):
        raise RuntimeError("the job failed (1): NCCL error")

    def slow(tmp):
        now[0] += 1_000.0  # the time left is spent here
        return [{"check": "slow", "ok": True, "detail": ""}]

    now = [0.0]
    monkeypatch.setattr(gpu_check, "save", saving)
    monkeypatch.setattr(gpu_check, "machine", lambda: {"date": "2026-11-29T00:00:00+00:00"})
    monkeypatch.setattr(gpu_check.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(gpu_check, "CHECKS", (("broken", broken), ("slow", slow), ("late", slow)))
    cuda = SimpleNamespace(get_device_name=lambda i: "H200", nccl=SimpleNamespace(version=lambda: (2, 27, 3)))
    torch = SimpleNamespace(cuda=cuda, version=SimpleNamespace(cuda="13.0"), __version__="2.11.0")
    assert gpu_check.run_checks(torch, deadline=500.0) == 1
    assert written[:3] == [["broken"], ["broken", "slow"], ["broken", "slow", "late"]]
    final = json.loads((results / "gpu_check.json").read_text())
    assert [(c["check"], c["ok"]) for c in final["checks"]] == [("broken", False), ("slow", True), ("late", False)]
    assert "NCCL error" in final["checks"][0]["detail"] and "not run" in final["checks"][2]["detail"]
    assert "NCCL refuses two ranks on one GPU" in (results / "gpu_check.md").read_text()


def _trace(gather_stream: int) -> list[dict]:
    """Two profiled steps: 100 ms of compute on stream 7, an asynchronous all-gather whose copy (0.4 ms) runs on
    ``gather_stream``, and a one-rank in-place all-reduce that launches nothing."""
    events = []
    for step, t0 in ((40, 0), (41, 200_000)):
        events += [{"ph": "X", "name": f"ProfilerStep#{step}", "ts": t0, "dur": 150_000, "tid": 1},
                   {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": t0 + 10, "dur": 5, "tid": 1,
                    "args": {"correlation": step * 10}},
                   {"ph": "X", "cat": "kernel", "name": "sgemm", "ts": t0 + 20, "dur": 100_000, "tid": 7,
                    "args": {"correlation": step * 10, "stream": 7}},
                   {"ph": "X", "cat": "user_annotation", "name": "nccl:_allgather_base", "ts": t0 + 100, "dur": 50,
                    "tid": 1},
                   {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "ts": t0 + 110, "dur": 5, "tid": 1,
                    "args": {"correlation": step * 10 + 1}},
                   {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD", "ts": t0 + 100_030, "dur": 400,
                    "tid": gather_stream, "args": {"correlation": step * 10 + 1, "stream": gather_stream}},
                   {"ph": "X", "cat": "user_annotation", "name": "nccl:allreduce", "ts": t0 + 300, "dur": 20,
                    "tid": 1}]
    return events


@pytest.mark.parametrize("stream", [21, 7], ids=["asynchronous, on NCCL's stream", "on the compute stream"])
def test_each_collective_op_is_compared_with_the_gpu_work_it_launched(stream):
    """Matched by the op's annotation, not by its stream: a synchronous all-gather runs on the current stream since
    torch 2.7, which the check used to leave out as the compute stream (and compare the op with ~0)."""
    colls = [{"step": s, "op": "nccl:_allgather_base", "ms": 0.41} for s in (40, 41)] + \
            [{"step": s, "op": "nccl:allreduce", "ms": 0.01} for s in (40, 41)]
    by_op = gpu_check.op_times(_trace(stream))
    assert by_op == {"nccl:_allgather_base": {40: 0.4, 41: 0.4}, "nccl:allreduce": {40: 0.0, 41: 0.0}}
    gather, reduce = sorted(gpu_check.op_agreements(colls, by_op), key=lambda c: "reduce" in c["check"])
    assert gather["ok"] and "2.5%" in gather["detail"]
    assert reduce["ok"] and reduce["detail"].startswith("shown, not compared")
    assert gpu_check.step_spans(_trace(stream)) == {40: pytest.approx(100.41), 41: pytest.approx(100.41)}
