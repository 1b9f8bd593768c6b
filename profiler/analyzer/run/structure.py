"""The parallel structure of a job, from what its ranks did: process groups, mesh, pipeline stages.

Which ranks do the same work decides every peer comparison (a pipeline's first stage is not a
straggler because it holds more layers than the last). The job's own configuration is not needed:

- process groups and their members: each rank's ``process_groups.json`` (written under
  `diagtrain run`), the traces' ``distributedInfo.pg_config``, and the flight recorder's entries;
- DeviceMesh dimensions: groups that DeviceMesh created are described ``mesh_<dim>``; a
  dimension's size is its groups' size, its order their stride (the innermost has stride 1);
- pipeline stages: from each rank's point-to-point calls (see p2p.py), whoever wrote them
  (torch.distributed.pipelining or hand-written send/recv); else a mesh dimension named like a
  pipeline; else the reference trainers' ``trainer.json``, one source among others.
"""

from __future__ import annotations

import operator
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from diagtrain.profiler.analyzer.read.flight_records import Entry
from diagtrain.profiler.analyzer.per_rank.p2p import P2PCalls
from diagtrain.profiler.run_dir import group_key, group_members
from diagtrain.profiler.util.identity import ByIdentity

MESH_PREFIX = "mesh_"  # DeviceMesh describes each dimension's groups as mesh_<name>
PIPELINE_DIMS = ("pp", "pipe", "pipeline", "stage")  # mesh dimension names that mean pipeline stages
DEFAULT_GROUP = "default_pg"


@dataclass
class ProcessGroup:
    """One process group: c10d's name, its description, its global ranks, who said so."""

    name: str
    desc: str | None
    ranks: tuple[int, ...]
    sources: list[str] = field(default_factory=list)
    ops: dict[str, int] = field(default_factory=dict)  # collectives seen on it, by op

    @property
    def key(self) -> str:
        """The key the collectives table uses for it (``run_dir.group_key``)."""
        return group_key(self.name, self.ranks)


@dataclass
class Structure:
    """How the job divides its work over ranks."""

    world_size: int | None = None
    groups: list[ProcessGroup] = field(default_factory=list)
    mesh: dict[str, int] = field(default_factory=dict)  # dimension -> size, outermost first
    mesh_source: str | None = None
    coords: dict[int, dict[str, int]] = field(default_factory=dict)  # rank -> {dimension: coordinate}
    stages: dict[int, int] = field(default_factory=dict)  # rank -> pipeline stage; empty: no pipeline
    stage_source: str | None = None
    microbatches: int | None = None
    microbatch_source: str | None = None
    # rank -> the group its point-to-point calls go through, where its peers name it back (gloo's
    # send/recv record only the peer's place in an unnamed group)
    p2p_groups: dict[int, ProcessGroup] = field(default_factory=dict)

    @property
    def n_stages(self) -> int:
        """Pipeline stages (1 without a pipeline)."""
        return len(set(self.stages.values())) or 1

    def stage_of(self, rank: int) -> int | None:
        """The pipeline stage ``rank`` runs, if the job is a pipeline."""
        return self.stages.get(int(rank))

    def peer_groups(self, ranks: list[int]) -> list[list[int]]:
        """Ranks doing the same work: the same pipeline stage (all ranks without a pipeline).

        Data-, tensor- and sequence-parallel ranks run the same code on equal shares, so they are
        peers; ranks of different stages run different layers and are compared only with their own.
        """
        if not self.stages:
            return [sorted(map(int, ranks))]  # map, not a generator: 8,192 ranks three times a live judgement
        by_stage: dict[Any, list[int]] = {}
        for r in sorted(map(int, ranks)):
            by_stage.setdefault(self.stages.get(r, f"unknown-{r}"), []).append(r)
        return list(by_stage.values())

    def stage_ranks(self, stage: int) -> list[int]:
        """The ranks that run pipeline stage ``stage``."""
        return sorted(r for r, s in self.stages.items() if s == stage)

    def describe(self) -> list[str]:
        """One line per fact, for the report."""
        lines = []
        if self.mesh:
            lines.append("DeviceMesh " + " x ".join(f"{d}={n}" for d, n in self.mesh.items()) + f" (from {self.mesh_source})")
        named = [g for g in self.groups if len(g.ranks) > 1]
        if named:
            shown = ", ".join(f"{g.desc or g.name} [{_ranks(g.ranks)}]" for g in named[:12])
            lines.append(f"{len(named)} process group{'s' if len(named) > 1 else ''}: {shown}"
                         + (" ..." if len(named) > 12 else ""))
        if self.stages:
            per_stage = "; ".join(f"stage {s}: ranks {_ranks(self.stage_ranks(s))}" for s in range(self.n_stages))
            lines.append(f"pipeline of {self.n_stages} stages (from {self.stage_source}): {per_stage}"
                         + (f"; {self.microbatches} microbatch{'es' if self.microbatches != 1 else ''} "
                            f"(from {self.microbatch_source})" if self.microbatches else ""))
        return lines

    def to_json(self) -> dict[str, Any]:
        """The report.json record (JSON object keys are strings)."""
        doc = asdict(self)
        doc["groups"] = [{**asdict(g), "ranks": list(g.ranks)} for g in self.groups]
        doc["coords"] = {str(r): c for r, c in sorted(self.coords.items())}
        doc["stages"] = {str(r): s for r, s in sorted(self.stages.items())}
        doc["p2p_groups"] = {str(r): {**asdict(g), "ranks": list(g.ranks)} for r, g in sorted(self.p2p_groups.items())}
        doc["lines"] = self.describe()
        return doc


def infer(process_groups: dict[int, dict], pg_configs: dict[int, list[dict]], flight_records: list[Entry],
          p2p: dict[int, P2PCalls], collective_ops: dict[str, dict[str, int]], trainer: dict | None,
          world_size: int | None) -> Structure:
    """The structure from every source there is; each one is optional."""
    groups = _groups(process_groups, pg_configs, flight_records, collective_ops)
    s = Structure(world_size=world_size, groups=groups)
    s.mesh, s.coords = _mesh(groups)
    s.mesh_source = "process groups" if s.mesh else None
    if not s.mesh and trainer and trainer.get("mesh"):
        s.mesh = {d: int(n) for d, n in trainer["mesh"].items() if int(n or 1) > 1}
        s.mesh_source = "trainer.json" if s.mesh else None
    s.p2p_groups = {r: g for r, calls in p2p.items() if not calls.empty
                    for g in [_peer_group(s, r, calls, p2p)] if g is not None}
    s.stages, s.stage_source = _stages(s, p2p, trainer)
    s.microbatches, s.microbatch_source = _microbatches(s, p2p, trainer)
    return s


def _groups(process_groups: dict[int, dict], pg_configs: dict[int, list[dict]], flight_records: list[Entry],
            collective_ops: dict[str, dict[str, int]]) -> list[ProcessGroup]:
    found = _listed(process_groups)
    for configs in pg_configs.values():
        for g in configs or []:
            found.add(g.get("pg_name"), g.get("pg_desc"), g.get("ranks"), "trace")
    # The flight recorder names groups; its members are those listed in the key (once keyed by
    # members, see flight_records.keyed_by_members), else the ranks that recorded it.
    recorded: dict[str, set[int]] = {}
    descs: dict[str, str | None] = {}
    for e in flight_records:
        recorded.setdefault(e.pg, set()).add(e.rank)
        descs[e.pg] = descs.get(e.pg) or e.pg_desc
    for pg, ranks in recorded.items():
        listed = group_members(pg)
        found.add(pg.rpartition(":")[0] if listed else pg, descs[pg], listed or ranks, "flight recorder")
    for g in found.groups.values():  # its key written only to be looked up (the world's group: 8,192 ranks, 1 ms)
        g.ops = dict(collective_ops.get(g.key, {})) if collective_ops else {}
    largest = max((len(g.ranks) for g in found.groups.values()), default=0)  # once, not once per group compared
    return sorted(found.groups.values(), key=lambda g: (len(g.ranks) != largest, _name_order(g.name), g.ranks))


class _Found:
    """The groups found so far. Each is keyed by its name and its members' one tuple (by identity): every rank lists
    the world's group, and hashing its members per rank was the world squared (8,192 ranks: 67M ranks hashed at every
    judgement)."""

    def __init__(self, groups: dict[tuple[str, int], ProcessGroup] | None = None,
                 distinct: dict[tuple[int, ...], tuple[int, ...]] | None = None) -> None:
        self.groups = {} if groups is None else groups
        self.distinct = {} if distinct is None else distinct  # members -> their one tuple
        self._members = ByIdentity(lambda given: self.distinct.setdefault(
            m := tuple(sorted(int(r) for r in given or ())), m))

    def add(self, name: Any, desc: str | None, ranks: Any, source: str) -> None:
        """A group as ``source`` lists it: a new one, or another source (and maybe a description) of one found."""
        members = self._members(ranks)
        if not members:
            return
        key = (str(name), id(members))
        group = self.groups.get(key)
        if group is None:  # made once: every one of 8,192 ranks lists the world's group
            group = self.groups[key] = ProcessGroup(str(name), desc or None, members)
        group.desc = group.desc or desc or None
        if source not in group.sources:
            group.sources.append(source)

    def copy(self) -> _Found:
        """The same groups as new objects, to add to and change without changing these."""
        return _Found({k: replace(g, sources=list(g.sources), ops=dict(g.ops)) for k, g in self.groups.items()},
                      dict(self.distinct))


# The groups of the last process groups read (held: their ranks' entries, compared by identity, and what they
# found). Live judgement reads the same entries every few seconds, adding a rank's when it writes them (8,192 ranks'
# entries: 4-9 ms a judgement). A rank's entry is replaced, never changed in place (read_process_groups gives a new
# one): another entry, one more or one less, or another order finds them again.
_last_listed: tuple[list[dict], _Found] | None = None


def _listed(process_groups: dict[int, dict]) -> _Found:
    """The groups the ranks' process_groups.json list, as new objects (each call's to change)."""
    global _last_listed
    last = _last_listed  # read once: another thread may replace it
    if last is not None and len(last[0]) == len(process_groups) \
            and all(map(operator.is_, last[0], process_groups.values())):
        return last[1].copy()
    found = _Found()
    listed: set[tuple[Any, Any, int]] = set()  # a group as a rank lists it: added once, however many ranks do
    for groups in process_groups.values():
        for name, info in (groups or {}).items():
            info = info or {}
            key = (name, info.get("desc"), id(info.get("ranks")))  # the members' one tuple, alive while they are read
            if key not in listed:
                listed.add(key)
                found.add(name, info.get("desc"), info.get("ranks"), "process_groups.json")
    _last_listed = (list(process_groups.values()), found)
    return found.copy()


def _name_order(name: str) -> tuple[int, str]:
    return (int(name), "") if name.isdigit() else (1 << 30, name)


def _mesh(groups: list[ProcessGroup]) -> tuple[dict[str, int], dict[int, dict[str, int]]]:
    """DeviceMesh dimensions (outermost first) and each rank's coordinates in them."""
    dims: dict[str, list[ProcessGroup]] = {}
    for g in groups:
        if g.desc and g.desc.startswith(MESH_PREFIX) and len(g.ranks) > 1:
            dims.setdefault(g.desc[len(MESH_PREFIX):], []).append(g)
    if not dims:
        return {}, {}
    stride = {d: gs[0].ranks[1] - gs[0].ranks[0] for d, gs in dims.items()}
    order = sorted(dims, key=lambda d: -stride[d])
    coords: dict[int, dict[str, int]] = {}
    for d in order:
        for g in dims[d]:
            for i, r in enumerate(g.ranks):
                coords.setdefault(r, {})[d] = i
    return {d: len(dims[d][0].ranks) for d in order}, coords


def _stages(s: Structure, p2p: dict[int, P2PCalls], trainer: dict | None) -> tuple[dict[int, int], str | None]:
    stages = _stages_from_p2p(s, p2p)
    if stages:
        recorded = {p2p[r].source for r in stages if r in p2p}
        where = {"flight recorder": " in the flight recorder", "counters": " counted in the ranks"}
        return stages, "point-to-point calls" + (where.get(next(iter(recorded)), "") if len(recorded) == 1 else "")
    pipeline_dim = next((d for d in s.mesh if d.lower() in PIPELINE_DIMS), None)
    if pipeline_dim and s.coords:
        return {r: c[pipeline_dim] for r, c in s.coords.items() if pipeline_dim in c}, f"DeviceMesh dimension {pipeline_dim}"
    mesh = (trainer or {}).get("mesh") or {}
    pp, world = int(mesh.get("pp") or 1), s.world_size or 0
    if pp > 1 and world and world % pp == 0:
        # The reference trainers' mesh order is pp, dp, tp: stage s holds ranks s*dp*tp ...
        return {r: r // (world // pp) for r in range(world)}, "trainer.json"
    return {}, None


def _stages_from_p2p(s: Structure, p2p: dict[int, P2PCalls]) -> dict[int, int]:
    """Stage of each rank from who starts its steps by sending, and from whom the others receive."""
    resolve = {r: _peer_resolver(s.p2p_groups.get(r)) for r, calls in p2p.items() if not calls.empty}
    first: dict[int, tuple[str, int | None]] = {}
    for r, calls in p2p.items():
        if r not in resolve or not calls.first:
            continue
        kind, peer = Counter(tuple(v) for v in calls.first.values()).most_common(1)[0][0]
        first[r] = (kind, resolve[r](int(peer)))
    successors: dict[int, list[int]] = {}
    for r, (kind, peer) in first.items():
        if kind == "recv" and peer is not None:
            successors.setdefault(peer, []).append(r)
    stages: dict[int, int] = {}
    frontier = sorted(r for r, (kind, _) in first.items() if kind == "send")
    depth = 0
    while frontier:
        for r in frontier:
            stages.setdefault(r, depth)
        frontier = sorted({q for r in frontier for q in successors.get(r, []) if q not in stages})
        depth += 1
    return stages if len(set(stages.values())) > 1 else {}


def _peer_resolver(group: ProcessGroup | None):
    """Global rank of a peer named by its place in ``group`` (None when the group is unknown)."""
    if group is None:
        return lambda p: None
    return lambda p: group.ranks[p] if p < len(group.ranks) else None


def _peer_group(s: Structure, rank: int, calls: P2PCalls, p2p: dict[int, P2PCalls]) -> ProcessGroup | None:
    """The group ``rank``'s point-to-point calls name peers in: the one in which its peers name it back."""
    local_peers = set(calls.sends_per_step) | set(calls.recvs_per_step)
    # Smallest first; of groups with the same members (which name peers alike), the default group:
    # calls that name no group use it.
    candidates = sorted((g for g in s.groups if rank in g.ranks and len(g.ranks) > 1),
                        key=lambda g: (len(g.ranks), g.desc != DEFAULT_GROUP))
    if s.world_size:
        candidates.append(ProcessGroup("world", DEFAULT_GROUP, tuple(range(s.world_size))))
    for g in candidates:
        if not all(p < len(g.ranks) for p in local_peers):
            continue
        me = g.ranks.index(rank)
        peers = [g.ranks[p] for p in local_peers]
        if rank in peers:
            continue  # nobody sends to itself: not the group these calls use
        # Reciprocal: each peer's own calls name this rank by its place in the same group.
        if all(q in p2p and me in (set(p2p[q].sends_per_step) | set(p2p[q].recvs_per_step)) for q in peers):
            return g
    return None


def _microbatches(s: Structure, p2p: dict[int, P2PCalls], trainer: dict | None) -> tuple[int | None, str | None]:
    annotated = [c.microbatches for c in p2p.values() if c.microbatches]
    if annotated:
        return Counter(annotated).most_common(1)[0][0], "the schedule's annotations"
    if s.stages and (s.stage_source or "").startswith("point-to-point calls"):
        # The first stage sends each microbatch's activations once per step (one stage per rank).
        sends = [max(p2p[r].sends_per_step.values(), default=0) for r in s.stage_ranks(0) if r in p2p]
        if sends and all(n == sends[0] for n in sends) and sends[0] >= 1:
            return int(sends[0]), "sends per step from the first stage"
    if trainer and trainer.get("n_microbatches"):
        return int(trainer["n_microbatches"]), "trainer.json"
    return None, None


def _ranks(ranks) -> str:
    ranks = list(ranks)
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))
