"""Always-on counters of where a rank's main thread spends each step, for any job, at ~no cost.

Installed in every rank when torch is imported (and by an explicit StepRecorder), with no help
from the program:

- **communication**: time the main thread is blocked in collectives and point-to-point
  operations, and how many were issued. Blocking shows up in Python as ``Work.wait`` (every
  synchronous ``torch.distributed`` call, FSDP2's and pipelining's waits on their async work) and
  as the functional collectives' ``wait_tensor`` (DTensor). DDP's bucket all-reduces run in C++
  and its reducer waits for them at the end of backward, in the autograd engine's final
  callbacks: while a DDP model exists, the time spent in those callbacks counts as communication.
  Issued operations are counted from each process group's sequence number, which every
  collective and p2p operation advances, whoever issues it (DDP's reducer included).
- **phases**, for a job without its own StepRecorder: ``data`` (inside a DataLoader iterator's
  ``__next__``), ``forward`` (the outermost module calls: global module hooks find those modules in
  the first steps, then only they keep a hook), ``backward`` (``torch.autograd.backward``
  and ``grad``), ``optimizer`` (the optimizer-step hooks). Phases do not overlap: one entered
  while another is open belongs to the open one (activation checkpointing re-runs forward inside
  backward). Communication inside a phase is also counted per phase.
- **CPU**: the process's CPU time (all threads), and the main thread's wait for a CPU (its
  run-queue delay, from ``/proc``): what tells "this rank did more work" from "this rank was
  starved by another process". And the process's minor page faults: a rank whose allocator gives
  memory back to the kernel and touches it again every step does the same work more slowly.
- **memory** at each step's end: the process's resident memory (``/proc/self/statm``, one read),
  and on a GPU the CUDA caching allocator's allocated and reserved bytes and its peak (read, never
  reset here: the user's own ``max_memory_allocated`` stays theirs): what shows memory that grows
  step after step (a leak) in a job that was never profiled.

Only the training thread counts (the main thread, or the one that runs the StepRecorder or steps
the optimizer, for loops run in a thread of their own): a training step is spent there. Everything here is cheap (a few
microseconds per wait or per module call, one ``/proc`` read per step), catches its own failures,
says so once on stderr and stands down; the user's call always goes through.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable

from diagtrain.profiler.rank.after_import import call_after_import

try:
    import resource
except ImportError:  # Windows
    resource = None  # type: ignore[assignment]

FUNCTIONAL_COLLECTIVES = "torch.distributed._functional_collectives"
NS_PER_S = 1e9
# Global module hooks put every module call on torch's slower hooked path (~10 us a call). They
# run for this many steps, to learn the outermost modules (the model, the loss), which then keep
# hooks of their own while the global ones go.
LEARN_STEPS = 2
try:
    PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")  # /proc/self/statm counts pages
except (AttributeError, ValueError, OSError):  # not a POSIX system: no statm either
    PAGE_BYTES = 4096


@dataclass(frozen=True)
class Reading:
    """Cumulative counters at one moment; a step's values are the difference of two readings."""

    comm_s: float
    comm_calls: int | None  # None: torch.distributed is not available
    cpu_s: float
    runq_s: float | None  # None: /proc/<pid>/task/<tid>/schedstat cannot be read here
    page_faults: int | None = None  # minor page faults of the process; None: no getrusage here
    rss_bytes: int | None = None  # resident memory now (not cumulative); None: no /proc/self/statm here
    comm_runq_s: float = 0.0  # the part of runq_s spent inside timed waits (woken from one, waiting for a CPU)

    def since(self, before: Reading) -> dict[str, Any]:
        """The step record's counter fields for the interval from ``before`` to this reading."""
        fields: dict[str, Any] = {"cpu_ms": round((self.cpu_s - before.cpu_s) * 1e3, 3)}
        if self.comm_calls is not None:
            fields["comm_ms"] = round((self.comm_s - before.comm_s) * 1e3, 3)
            fields["comm_calls"] = self.comm_calls - (before.comm_calls or 0)
        if self.runq_s is not None and before.runq_s is not None:
            fields["runq_ms"] = round((self.runq_s - before.runq_s) * 1e3, 3)
            fields["comm_runq_ms"] = round((self.comm_runq_s - before.comm_runq_s) * 1e3, 3)
        if self.page_faults is not None and before.page_faults is not None:
            fields["page_faults"] = self.page_faults - before.page_faults
        if self.rss_bytes is not None:
            fields["rss_bytes"] = self.rss_bytes  # at the interval's end
        return fields


@dataclass
class PhaseClock:
    """Non-overlapping phases of the main thread: seconds per phase, and communication within."""

    totals: dict[str, float] = field(default_factory=dict)
    comm: dict[str, float] = field(default_factory=dict)
    _depth: dict[str, int] = field(default_factory=dict)
    _active: str | None = None
    _since: float = 0.0
    on_enter: Callable[[str], None] | None = None  # told each phase entered (the recorder's device clock)

    def enter(self, name: str) -> None:
        """Enter ``name`` (nested entries of the same phase are one)."""
        self._depth[name] = self._depth.get(name, 0) + 1
        if self.on_enter is not None:
            self.on_enter(name)
        if self._active is None:
            self._active, self._since = name, time.perf_counter()

    def exit(self, name: str) -> None:
        """Leave ``name``; the phase ends when its outermost entry is left."""
        depth = self._depth.get(name, 0)
        if depth <= 0:
            return
        self._depth[name] = depth - 1
        if depth == 1 and self._active == name:
            self.totals[name] = self.totals.get(name, 0.0) + time.perf_counter() - self._since
            self._active = None

    def idle(self) -> bool:
        """No phase is open."""
        return self._active is None

    def depth(self, name: str) -> int:
        return self._depth.get(name, 0)

    def add_comm(self, seconds: float) -> None:
        if self._active is not None:
            self.comm[self._active] = self.comm.get(self._active, 0.0) + seconds

    def take(self) -> tuple[dict[str, float], dict[str, float]]:
        """(seconds per phase, communication seconds per phase) since the last call; an open
        phase is split at this moment (an optimizer stepping inside backward ends a step there)."""
        now = time.perf_counter()
        if self._active is not None:
            self.totals[self._active] = self.totals.get(self._active, 0.0) + now - self._since
            self._since = now
        totals, comm = self.totals, self.comm
        self.totals, self.comm = {}, {}
        return totals, comm


class Counters:
    """The process's counters (one instance, :data:`COUNTERS`) and the hooks that feed them."""

    def __init__(self) -> None:
        self.installed = False
        self.tracking_phases = False
        self.failed = False
        self.comm_s = 0.0
        # A thread woken from a blocking wait (gloo's) queues for a CPU before the wait returns: that run-queue
        # time is inside comm_s too, and the step's time splits into waits, run queue and running only without it.
        self.comm_runq_s = 0.0
        self._runq_at_wait: float | None = None  # the run queue's total when the current wait began (main thread)
        self.phases = PhaseClock()
        self.start: Reading | None = None  # at install: step 1 of an implicit recorder counts from here
        self._main = threading.main_thread().ident
        self._blocked = False  # inside a timed wait: nested waits are not counted twice
        self._distributed = False
        self._calls = 0
        self._seq: dict[str, int] = {}  # process-group name -> sequence number last seen
        self._ddp: weakref.WeakSet = weakref.WeakSet()
        self._module_hooks: list[Any] = []
        self._global_hooks = False  # the module hooks are the global ones, still learning the roots
        self._roots: weakref.WeakSet = weakref.WeakSet()  # modules called with no phase open
        self._roots_known = True
        self._steps_seen = 0
        self._schedstat = _open_schedstat(threading.main_thread().native_id)
        self._statm: tuple[int, int | None] | None = None  # (pid, descriptor): opened by that process
        self._gpu_failed = False  # reading the CUDA allocator's statistics failed once: not tried again
        self._p2p_first: list | None = None  # this step's first point-to-point call: [kind, peer]
        self._p2p: dict[str, dict[int, int]] = {"send": {}, "recv": {}}  # kind -> peer -> calls this step
        self._samples = 0  # samples in the batches the training thread loaded this step

    # -- installation --------------------------------------------------------------------------

    def install(self) -> None:
        """Wrap torch's waits, backward, DataLoader iterators and DDP construction (once)."""
        if self.installed or self.failed:
            return
        self.installed = True
        torch = sys.modules["torch"]
        try:
            torch.autograd.backward = _backward_wrapper(torch.autograd.backward, self, ddp_window=True)
            torch.autograd.grad = _backward_wrapper(torch.autograd.grad, self, ddp_window=False)
            iterator = torch.utils.data.dataloader._BaseDataLoaderIter
            iterator.__next__ = _data_wrapper(iterator.__next__, self)
            if torch.distributed.is_available():
                self._distributed = True
                work = torch.distributed.distributed_c10d.Work
                work.wait = _wait_wrapper(work.wait, self)
                ddp = torch.nn.parallel.DistributedDataParallel
                ddp.__init__ = _remember_ddp(ddp.__init__, self)
                # The first forward after DDP's first backward re-buckets the gradients and
                # broadcasts the new layout from C++: a wait on every rank, once.
                reducer = torch.distributed.Reducer
                reducer._rebuild_buckets = _wait_wrapper(reducer._rebuild_buckets, self)
                # Every send and receive (isend/irecv, send/recv, batch_isend_irecv, pipelining) goes
                # through these, with the peer's rank in the group: what tells pipeline stages apart.
                group = torch.distributed.ProcessGroup
                group.send = _p2p_wrapper(group.send, self, "send")
                group.recv = _p2p_wrapper(group.recv, self, "recv")
                call_after_import(FUNCTIONAL_COLLECTIVES, self._wrap_functional_waits)
        except Exception as e:  # noqa: BLE001 - counters are optional; the job is not
            self.fail(e)
        self.start = self.read()

    def _wrap_functional_waits(self, funcol: ModuleType) -> None:
        funcol.wait_tensor = _wait_wrapper(funcol.wait_tensor, self, skip_when_compiling=True)

    def set_phase_tracking(self, on: bool) -> None:
        """Time data/forward/backward phases (a job without its own StepRecorder) or stop doing so.

        Global module hooks find the outermost modules during the first LEARN_STEPS steps (see
        step_ended); they go as soon as the program's own StepRecorder takes over.
        """
        if on == self.tracking_phases or self.failed:
            return
        self.tracking_phases = on
        try:
            if on:
                from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

                self._module_hooks = [register_module_forward_pre_hook(self._forward_started),
                                      register_module_forward_hook(self._forward_ended, always_call=True)]
                self._global_hooks = True
            else:
                self._remove_module_hooks()
        except Exception as e:  # noqa: BLE001
            self.fail(e)

    def step_ended(self) -> None:
        """At each step boundary of a job without its own StepRecorder: after LEARN_STEPS steps, the
        outermost modules seen keep forward hooks of their own and the global hooks go."""
        self._steps_seen += 1
        if not (self._global_hooks and self._roots_known and self._steps_seen >= LEARN_STEPS
                and self.phases.depth("forward") == 0):
            return
        try:
            roots = list(self._roots)
            self._remove_module_hooks()
            for module in roots:
                self._module_hooks += [module.register_forward_pre_hook(self._forward_started),
                                       module.register_forward_hook(self._forward_ended, always_call=True)]
            self._roots = weakref.WeakSet()
        except Exception as e:  # noqa: BLE001
            self.fail(e)

    def _remove_module_hooks(self) -> None:
        for handle in self._module_hooks:
            handle.remove()
        self._module_hooks, self._global_hooks = [], False

    def follow_current_thread(self) -> None:
        """Count the calling thread from now on: the one that runs the training loop."""
        if threading.get_ident() == self._main:
            return
        self._main = threading.get_ident()
        previous, self._schedstat = self._schedstat, _open_schedstat(threading.get_native_id())
        if previous is not None:
            os.close(previous)

    def restart_in_child(self) -> None:
        """Count from now in a forked child that becomes a rank: its own thread, none of its parent's totals."""
        previous, self._schedstat = self._schedstat, _open_schedstat(threading.get_native_id())
        if previous is not None:
            os.close(previous)  # the child's copy of a descriptor on the parent's thread
        self._main = threading.get_ident()
        self.phases = PhaseClock()
        self.start = self.read()

    def fail(self, error: BaseException) -> None:
        """Stand down after an error of our own, saying so once on the rank's stderr."""
        if not self.failed:
            self.failed = True
            print(f"diagtrain: step counters disabled: {type(error).__name__}: {error}", file=sys.stderr)
        self.tracking_phases = False
        try:
            self._remove_module_hooks()
        except Exception:  # noqa: BLE001 - standing down as far as possible
            pass

    # -- what the hooks call ---------------------------------------------------------------------

    def on_main_thread(self) -> bool:
        return threading.get_ident() == self._main

    def comm_begin(self) -> float | None:
        """Start timing a wait; None when it is not counted (nested, another thread, stood down)."""
        if self._blocked or self.failed or threading.get_ident() != self._main:
            return None
        self._blocked = True
        self._runq_at_wait = self._wait_runq()
        return time.perf_counter()

    def comm_begin_window(self) -> float | None:
        """Like comm_begin, for backward's final callbacks, which run off the main thread on GPU."""
        if self._blocked or self.failed:
            return None
        self._blocked = True
        # The run queue read is the main thread's: another thread's wait is not in it.
        self._runq_at_wait = self._wait_runq() if threading.get_ident() == self._main else None
        return time.perf_counter()

    def comm_end(self, started: float) -> None:
        seconds = time.perf_counter() - started
        self._blocked = False
        if self._runq_at_wait is not None and (now := self._wait_runq()) is not None:
            self.comm_runq_s += max(0.0, now - self._runq_at_wait)  # max: the thread followed changed meanwhile
        self._runq_at_wait = None
        self.comm_s += seconds
        self.phases.add_comm(seconds)

    def phase_enter(self, name: str) -> None:
        if self.tracking_phases and threading.get_ident() == self._main:
            self.phases.enter(name)

    def phase_exit(self, name: str) -> None:
        if self.tracking_phases and threading.get_ident() == self._main:
            self.phases.exit(name)

    def _forward_started(self, module: Any, args: Any) -> None:
        if _is_compiling() or not self.tracking_phases or threading.get_ident() != self._main:
            return
        if self._global_hooks and self.phases.idle():
            try:
                self._roots.add(module)
            except TypeError:  # a module class that cannot be hashed or weakly referenced
                self._roots_known = False  # so the global hooks stay
        self.phases.enter("forward")

    def _forward_ended(self, module: Any, args: Any, output: Any) -> None:
        if not _is_compiling():
            self.phase_exit("forward")

    def modules(self) -> list[Any]:
        """The job's models as far as the hooks saw them: those wrapped in DDP, then the outermost modules
        called in a forward (while the global hooks still learn them)."""
        return [*self._ddp, *self._roots]

    def ddp_alive(self) -> bool:
        return len(self._ddp) > 0

    def p2p_call(self, kind: str, peer: Any) -> None:
        """A send or receive to ``peer`` (its rank in the call's group) was issued."""
        if isinstance(peer, int):
            if self._p2p_first is None:
                self._p2p_first = [kind, peer]
            counts = self._p2p[kind]
            counts[peer] = counts.get(peer, 0) + 1

    def take_p2p(self) -> dict[str, Any] | None:
        """The point-to-point calls since the last take (the step's record field ``p2p``), or None if none."""
        if self._p2p_first is None:
            return None
        taken = {"first": self._p2p_first, **{k: {str(p): n for p, n in v.items()} for k, v in self._p2p.items() if v}}
        self._p2p_first, self._p2p = None, {"send": {}, "recv": {}}
        return taken

    def batch_loaded(self, batch: Any) -> None:
        """The training thread took ``batch`` from a DataLoader: count its samples."""
        if threading.get_ident() == self._main:
            self._samples += _batch_size(batch) or 0

    def take_samples(self) -> int | None:
        """The samples loaded since the last take (the step's record field ``samples``), or None if none."""
        taken, self._samples = self._samples, 0
        return taken or None

    # -- reading -----------------------------------------------------------------------------------

    def read(self) -> Reading | None:
        """The cumulative counters now (None once stood down)."""
        if self.failed:
            return None
        try:
            return Reading(self.comm_s, self._comm_calls(), time.process_time(), self._runq_s(), _page_faults(),
                           self._rss_bytes(), self.comm_runq_s)
        except Exception as e:  # noqa: BLE001
            self.fail(e)
            return None

    def _comm_calls(self) -> int | None:
        if not self._distributed:
            return None
        dist = sys.modules["torch.distributed"]
        if dist.is_initialized():
            for group, name in list(dist.distributed_c10d._world.pg_names.items()):
                try:
                    seq = group._get_sequence_number_for_group()
                except Exception:  # noqa: BLE001 - a backend without sequence numbers: not counted
                    continue
                self._calls += max(0, seq - self._seq.get(name, 0))
                self._seq[name] = seq
        return self._calls

    def _runq_s(self) -> float | None:
        if self._schedstat is None:
            return None
        # "<ns on a CPU> <ns waiting on a run queue> <timeslices>"
        return int(os.pread(self._schedstat, 64, 0).split()[1]) / NS_PER_S

    def _wait_runq(self) -> float | None:
        """The run queue's total at a wait's edge; None where it cannot be read (the wait is the job's: never raises)."""
        try:
            return self._runq_s()
        except (OSError, ValueError, IndexError):
            return None

    def _rss_bytes(self) -> int | None:
        pid = os.getpid()
        if self._statm is None or self._statm[0] != pid:  # "self" is the process that opened it: a forked child reopens
            self._statm = (pid, _open_proc_file("/proc/self/statm"))
        if self._statm[1] is None:
            return None
        try:
            # "<size> <resident> <shared> ..." in pages
            return int(os.pread(self._statm[1], 128, 0).split()[1]) * PAGE_BYTES
        except (OSError, ValueError, IndexError):
            return None

    def gpu_memory(self, device: Any = None, peak_since_step: bool = False) -> dict[str, Any]:
        """The step record's GPU memory fields now (:func:`gpu_memory_fields`), on the recorder's CUDA
        ``device`` (whose recorder checks for a graph capture first) or, where the job initialized CUDA and
        captures no graph, its current device; ``{}`` on a CPU job.
        ``peak_since_step``: the recorder reset the allocator's peak when the step began."""
        if self._gpu_failed:
            return {}
        try:
            cuda = getattr(sys.modules.get("torch"), "cuda", None)
            if cuda is None:
                return {}
            if device is None or getattr(device, "type", None) != "cuda":
                if not cuda.is_initialized() or cuda.is_current_stream_capturing():
                    return {}  # a CPU job, one that has not touched its GPU, or one capturing a CUDA graph
                device = cuda.current_device()
            return gpu_memory_fields(cuda.memory_stats_as_nested_dict(device), peak_since_step)
        except Exception as e:  # noqa: BLE001 - GPU memory is optional; the other counters stay
            self._gpu_failed = True
            print(f"diagtrain: GPU memory per step not recorded: {type(e).__name__}: {e}", file=sys.stderr)
            return {}


def gpu_memory_fields(stats: dict[str, Any], peak_since_step: bool = False) -> dict[str, Any]:
    """``gpu_allocated_bytes``, ``gpu_reserved_bytes`` (now) and ``gpu_peak_bytes`` (the most allocated)
    from the CUDA caching allocator's statistics as ``torch.cuda.memory_stats_as_nested_dict`` gives
    them; ``{}`` when they hold none (an allocator that keeps no statistics).

    The peak is torch's ``max_memory_allocated``, never reset (that would change the job's own
    numbers): ``gpu_peak_since`` is ``"start"``, the process's peak since it started; ``"step"``
    (runs before issue 49, whose recorder reset it as each step began) is still read.
    """
    try:
        allocated, reserved = stats["allocated_bytes"]["all"], stats["reserved_bytes"]["all"]
        fields = {"gpu_allocated_bytes": int(allocated["current"]), "gpu_reserved_bytes": int(reserved["current"]),
                  "gpu_peak_bytes": int(allocated["peak"])}
    except (KeyError, TypeError, ValueError):
        return {}
    return {**fields, "gpu_peak_since": "step" if peak_since_step else "start"}


def _page_faults() -> int | None:
    """The process's minor page faults so far (None where there is no getrusage)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt if resource is not None else None


def _open_schedstat(thread_id: int | None) -> int | None:
    """A descriptor on a thread's scheduler statistics (Linux), kept open: one read per step."""
    return _open_proc_file(f"/proc/self/task/{thread_id}/schedstat")


def _open_proc_file(path: str) -> int | None:
    """A descriptor on a ``/proc`` file, kept open (None where there is none: not Linux)."""
    try:
        return os.open(path, os.O_RDONLY)
    except OSError:
        return None


def _wait_wrapper(original: Callable, counters: Counters, skip_when_compiling: bool = False) -> Callable:
    """``original`` (a blocking wait), timed as communication when called on the main thread."""
    compiling = _is_compiling if skip_when_compiling else None

    @functools.wraps(original)
    def wait(*args: Any, **kwargs: Any) -> Any:
        if compiling is not None and compiling():
            return original(*args, **kwargs)
        started = counters.comm_begin()
        try:
            return original(*args, **kwargs)
        finally:
            if started is not None:
                counters.comm_end(started)

    return wait


def _p2p_wrapper(original: Callable, counters: Counters, kind: str) -> Callable:
    """``ProcessGroup.send`` or ``.recv`` (tensors, peer, tag), counted per peer."""

    @functools.wraps(original)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            counters.p2p_call(kind, args[1] if len(args) > 1 else kwargs.get("dstRank", kwargs.get("srcRank")))
        except Exception:  # noqa: BLE001 - never the job's problem
            pass
        return original(self, *args, **kwargs)

    return call


def _phase_wrapper(original: Callable, counters: Counters, name: str) -> Callable:
    """``original``, its time counted as phase ``name``."""

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        counters.phase_enter(name)
        try:
            return original(*args, **kwargs)
        finally:
            counters.phase_exit(name)

    return timed


def _data_wrapper(original: Callable, counters: Counters) -> Callable:
    """A DataLoader iterator's ``__next__``: timed as phase ``data``, its batch's samples counted."""
    timed = _phase_wrapper(original, counters, "data")

    @functools.wraps(original)
    def next_batch(*args: Any, **kwargs: Any) -> Any:
        batch = timed(*args, **kwargs)
        try:
            counters.batch_loaded(batch)
        except Exception as e:  # noqa: BLE001
            counters.fail(e)
        return batch

    return next_batch


# A batch is a tensor, or containers of them (a tuple of inputs and labels, a dict of fields):
# its size is the first dimension of the first tensor found this many containers deep.
BATCH_NESTING = 4


def _batch_size(batch: Any) -> int | None:
    """The number of samples in a DataLoader batch, None where it holds no tensor to tell."""
    for _ in range(BATCH_NESTING):
        if isinstance(batch, dict):
            batch = next(iter(batch.values()), None)
        elif isinstance(batch, (list, tuple)):
            batch = batch[0] if batch else None
        else:
            break
    shape = getattr(batch, "shape", None)
    return int(shape[0]) if shape else None


def _backward_wrapper(original: Callable, counters: Counters, ddp_window: bool) -> Callable:
    """``torch.autograd.backward`` or ``grad``, timed as the backward phase; with ``ddp_window``,
    the wait of DDP's reducer at its end is timed as communication."""

    @functools.wraps(original)
    def backward(*args: Any, **kwargs: Any) -> Any:
        if _is_compiling() or not counters.on_main_thread():
            return original(*args, **kwargs)
        window = None
        if ddp_window and counters.ddp_alive():
            window = _FinalCallbacks.open(counters, args[0] if args else kwargs.get("tensors"))
        counters.phase_enter("backward")
        try:
            return original(*args, **kwargs)
        finally:
            counters.phase_exit("backward")
            if window is not None:
                window.close()

    return backward


class _FinalCallbacks:
    """Times the autograd engine's final callbacks of one backward: where DDP's reducer waits for
    its bucket all-reduces (``finalize_backward``), out of Python's sight.

    A pre-hook on the root's node (the first node backward runs) queues a callback; callbacks run
    in the order queued once the graph is done, and one may queue another, which runs after all
    the rest. The first marks the start, the one it queues the end.
    """

    def __init__(self, counters: Counters) -> None:
        self.counters = counters
        self.started: float | None = None
        self.handle: Any = None

    @classmethod
    def open(cls, counters: Counters, tensors: Any) -> _FinalCallbacks | None:
        """Arm the window on the first root of ``tensors`` that has a graph; None if none has."""
        try:
            roots = tensors if isinstance(tensors, (list, tuple)) else (tensors,)
            node = next((t.grad_fn for t in roots if getattr(t, "grad_fn", None) is not None), None)
            if node is None:
                return None
            window = cls(counters)
            window.handle = node.register_prehook(window._graph_started)
            return window
        except Exception as e:  # noqa: BLE001
            counters.fail(e)
            return None

    def _graph_started(self, grad_outputs: Any) -> None:
        try:
            _queue_final_callback(self._callbacks_started)
        except Exception as e:  # noqa: BLE001
            self.counters.fail(e)

    def _callbacks_started(self) -> None:
        self.started = self.counters.comm_begin_window()
        if self.started is not None:
            try:
                _queue_final_callback(self._callbacks_ended)
            except Exception as e:  # noqa: BLE001 - the window then ends when backward returns
                self.counters.fail(e)

    def _callbacks_ended(self) -> None:
        self._finish()

    def _finish(self) -> None:
        if self.started is not None:
            started, self.started = self.started, None
            self.counters.comm_end(started)

    def close(self) -> None:
        """After backward returned (or raised): remove the hook; a window left open ends now."""
        self.handle.remove()
        self._finish()


def _queue_final_callback(callback: Callable[[], None]) -> None:
    from torch.autograd import Variable

    Variable._execution_engine.queue_callback(callback)


def _remember_ddp(original_init: Callable, counters: Counters) -> Callable:
    """DistributedDataParallel.__init__ that also remembers the model (weakly)."""

    @functools.wraps(original_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        try:
            counters._ddp.add(self)
        except Exception as e:  # noqa: BLE001
            counters.fail(e)

    return __init__


def _is_compiling() -> bool:
    torch = sys.modules["torch"]
    return torch.compiler.is_compiling()


COUNTERS = Counters()
