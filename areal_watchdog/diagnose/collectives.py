"""Analyse PyTorch Flight Recorder traces: which collective each rank is on, per process group.

Input: one parsed dump per rank (``torch._C._distributed_c10d._dump_fr_trace_json()``: ``entries``
with ``collective_seq_id``, ``profiling_name``, sizes and dtypes per collective, and ``pg_status``
with each group's last enqueued and completed sequence id). Output: plain data the classifier and
the report use. Pure functions: nothing here reads files or runs processes.

For each process group the analysis finds the first collective not every rank completed, then:

- ranks that never issued it are *missing* from it (they are stuck before it);
- ranks that issued different operations (or sizes, or dtypes) at that sequence id *disagree*:
  the minority diverged; with an even split, the rank whose operation breaks the pattern the
  group followed so far (what came after the previous collective the last times) is named, and
  with no such history the split is reported as a tie, naming nobody rather than guessing.

Only what must agree is compared: the operation and the dtypes always, the sizes except for the
operations whose per-rank sizes legally differ (``all_to_all`` with uneven splits, as in MoE
token routing; ``gather``/``scatter`` between root and the others). ``pg_status`` is keyed as
PyTorch keys it, by each rank's own ``pg_id`` (an int in NCCL pickles, a string in gloo JSON),
not by the process group's name: the two differ in any job with more than one group.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from areal_watchdog.common.rankset import ranks_phrase


@dataclass(frozen=True)
class Op:
    """One collective as issued by one rank."""

    seq: int
    name: str  # "all_reduce" (the backend prefix dropped)
    sizes: str
    dtypes: str

    @property
    def key(self) -> tuple[str, str, str]:
        """What must agree across ranks at one sequence id."""
        sizes = "" if _uneven_allowed(self.name) else self.sizes
        return (self.name, sizes, self.dtypes)

    def label(self) -> str:
        return f"#{self.seq} {self.name}"


@dataclass
class GroupFinding:
    """What the trace says about one process group."""

    group: str
    ranks: list[int]
    first_incomplete: int | None  # sequence id of the first collective not all ranks completed
    culprit_ranks: list[int]
    kind: str  # agree | missing | mismatch | complete
    description: str
    table: list[str] = field(default_factory=list)  # "ranks 0-2, 4-7 at #119 barrier"


@dataclass
class CollectiveEvidence:
    """The analysis of every process group, and which ranks gave no usable trace."""

    groups: list[GroupFinding]
    ranks_without_trace: list[int]

    @property
    def culprit_ranks(self) -> list[int]:
        """Ranks whose operations diverged; failing that, ranks missing from a collective."""
        for kind in ("mismatch", "missing"):
            found = {r for g in self.groups if g.kind == kind for r in g.culprit_ranks}
            if found:
                return sorted(found)
        return []

    @property
    def has_mismatch(self) -> bool:
        return any(g.kind == "mismatch" for g in self.groups)

    def to_dict(self) -> dict[str, Any]:
        return {
            "groups": [dict(g.__dict__) for g in self.groups],
            "ranks_without_trace": self.ranks_without_trace,
            "culprit_ranks": self.culprit_ranks,
        }


def _uneven_allowed(name: str) -> bool:
    """Operations whose input sizes legally differ from rank to rank."""
    bare = name.lower().replace("_", "")
    return "alltoall" in bare or (bare.startswith(("gather", "scatter")))


def _op_name(entry: dict[str, Any]) -> str:
    return str(entry.get("profiling_name", "?")).split(":", 1)[-1]


def rank_ops(dump: dict[str, Any]) -> dict[str, dict[int, Op]]:
    """Collectives of one rank by process group and sequence id (P2P entries skipped)."""
    ops: dict[str, dict[int, Op]] = defaultdict(dict)
    for entry in dump.get("entries", []):
        if entry.get("is_p2p"):
            continue
        group = str((entry.get("process_group") or ["?"])[0])
        seq = int(entry.get("collective_seq_id", -1))
        ops[group][seq] = Op(
            seq, _op_name(entry), str(entry.get("input_sizes")), str(entry.get("input_dtypes"))
        )
    return ops


def _pg_status(dump: dict[str, Any], group: str) -> dict[str, Any]:
    """This rank's status of ``group``, found by the rank's own ``pg_id`` for that group."""
    statuses = dump.get("pg_status") or {}
    for entry in dump.get("entries", []):
        if str((entry.get("process_group") or ["?"])[0]) == group and "pg_id" in entry:
            pg_id = entry["pg_id"]
            found = statuses.get(str(pg_id), statuses.get(pg_id))
            if isinstance(found, dict):
                return found
    return {}  # no pg_id recorded: the retired entries tell instead


def _last_completed(dump: dict[str, Any], group: str, ops: dict[int, Op]) -> int:
    status = _pg_status(dump, group)
    completed = status.get("last_completed_collective")
    if isinstance(completed, int) and completed >= 0:
        return completed
    retired = [
        int(e.get("collective_seq_id", -1))
        for e in dump.get("entries", [])
        if str((e.get("process_group") or ["?"])[0]) == group and e.get("retired")
    ]
    return max(retired, default=min(ops, default=1) - 1)


def analyse(dumps: dict[int, dict[str, Any]], world_size: int) -> CollectiveEvidence:
    """Analyse every rank's dump (``dumps[rank]``); ranks without one are listed as such."""
    per_rank = {rank: rank_ops(dump) for rank, dump in dumps.items()}
    groups = sorted({g for ops in per_rank.values() for g in ops})
    findings = []
    for group in groups:
        members = sorted(r for r, ops in per_rank.items() if group in ops)
        completed = {r: _last_completed(dumps[r], group, per_rank[r][group]) for r in members}
        findings.append(_analyse_group(group, {r: per_rank[r][group] for r in members}, completed))
    missing = [r for r in range(world_size) if r not in dumps]
    return CollectiveEvidence(findings, missing)


def _analyse_group(
    group: str, ops: dict[int, dict[int, Op]], completed: dict[int, int]
) -> GroupFinding:
    members = sorted(ops)
    table = _table(ops)
    first = _first_divergence(ops)
    if first is not None:  # the root cause may lie in a collective that "completed"
        seq, present = first
        variants = Counter(op.key for op in present.values())
        culprits = _diverging(present, variants, ops, seq)
        return GroupFinding(
            group, members, seq, culprits, "mismatch",
            _mismatch_text(group, seq, present, culprits, variants), table,
        )  # fmt: skip
    target = min(completed.values()) + 1
    issued = {r: ops[r].get(target) for r in members}
    if all(op is None for op in issued.values()):
        return GroupFinding(
            group,
            members,
            None,
            [],
            "complete",
            f"group {group}: every collective issued was completed",
            table,
        )
    missing = sorted(r for r, op in issued.items() if op is None)
    present = {r: op for r, op in issued.items() if op is not None}
    name = next(iter(present.values())).name
    if missing:
        return GroupFinding(
            group,
            members,
            target,
            missing,
            "missing",
            f"{ranks_phrase(missing)} never issued collective #{target} ({name}) of group "
            f"{group} that {ranks_phrase(sorted(present))} wait in",
            table,
        )
    return GroupFinding(
        group,
        members,
        target,
        [],
        "agree",
        f"every rank of group {group} is in collective #{target} ({name})",
        table,
    )


def _mismatch_text(
    group: str, seq: int, present: dict[int, Op], culprits: list[int], variants: Counter
) -> str:
    if culprits:
        others = sorted(set(present) - set(culprits))
        return (
            f"at collective #{seq} of group {group}, {ranks_phrase(culprits)} issued "
            f"{_describe(present, culprits)} while {ranks_phrase(others)} issued "
            f"{_describe(present, others)}"
        )
    sides = [sorted(r for r, op in present.items() if op.key == key) for key in variants]
    said = " while ".join(
        f"{ranks_phrase(side)} issued {_describe(present, side)}" for side in sides
    )
    return (
        f"at collective #{seq} of group {group}, a tie: {said}; with no earlier history to "
        "compare, neither side can be named"
    )


def _first_divergence(ops: dict[int, dict[int, Op]]) -> tuple[int, dict[int, Op]] | None:
    """The first sequence id every rank recorded at which their operations differ."""
    common = set.intersection(*(set(by_seq) for by_seq in ops.values()))
    for seq in sorted(common):
        present = {rank: by_seq[seq] for rank, by_seq in ops.items()}
        if len({op.key for op in present.values()}) > 1:
            return seq, present
    return None


def _describe(present: dict[int, Op], ranks: list[int]) -> str:
    """``all_reduce of [[1]] Int`` for the operation(s) those ranks issued."""
    kinds = sorted({(present[r].name, present[r].sizes, present[r].dtypes) for r in ranks})
    return (
        " / ".join(
            f"{name} of {sizes} {dtypes.strip('[]').replace(chr(39), '')}"
            for name, sizes, dtypes in kinds
        )
        or "nothing"
    )


def _diverging(
    present: dict[int, Op], variants: Counter, ops: dict[int, dict[int, Op]], target: int
) -> list[int]:
    ranked = variants.most_common()
    if ranked[0][1] > ranked[1][1]:
        return sorted(r for r, op in present.items() if op.key != ranked[0][0])
    expected = _expected_next(ops, target)
    if expected is not None:
        odd = sorted(r for r, op in present.items() if op.key != expected)
        if 0 < len(odd) < len(present):
            return odd
    return []  # a tie with no history: naming one side would be a guess by rank number


def _expected_next(ops: dict[int, dict[int, Op]], target: int) -> tuple[str, str, str] | None:
    """What usually followed the collective before ``target``, from the agreed history."""

    def agreed(seq: int) -> tuple[str, str, str] | None:
        keys = {rank_ops[seq].key for rank_ops in ops.values() if seq in rank_ops}
        return keys.pop() if len(keys) == 1 else None

    previous = agreed(target - 1)
    if previous is None:
        return None
    followers = Counter(
        nxt
        for seq in range(target - 2, 0, -1)
        if agreed(seq) == previous and (nxt := agreed(seq + 1)) is not None
    )
    return followers.most_common(1)[0][0] if followers else None


def _table(ops: dict[int, dict[int, Op]]) -> list[str]:
    """Each rank's last issued collective, ranks grouped: "ranks 0-2 at #119 barrier"."""
    rows: dict[str, list[int]] = defaultdict(list)
    for rank, by_seq in ops.items():
        last = by_seq[max(by_seq)] if by_seq else None
        rows[last.label() if last else "no collective"].append(rank)
    ordered = sorted(rows.items(), key=lambda item: (-len(item[1]), min(item[1])))
    return [f"{ranks_phrase(ranks)} at {label}" for label, ranks in ordered]
