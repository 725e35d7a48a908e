"""Analyse PyTorch Flight Recorder traces: which collective each rank is on, per process group.

Input: one parsed dump per rank (JSON or pickle, full or ``onlyActive``, gloo or NCCL): ``entries``
with ``collective_seq_id``, ``profiling_name``, ``process_group`` (name, description), the rank's
own ``pg_id``, sizes and dtypes per collective; ``pg_status`` keyed by each rank's own ``pg_id``
(ints in NCCL pickles, strings in gloo and JSON dumps; the group *name* is what all ranks share);
``pg_config`` with member ranks when the backend filled it in (NCCL). Output: plain data the
classifier and the report use. Pure functions: nothing here reads files or runs processes. Just
past 400 lines: one analysis (a group's divergence, its missing ranks, the chain between groups)
whose steps share their data, and that reads best in one place.

For each process group (identified by its name, common to all ranks):

- the **first divergence**: the first sequence id every rank recorded at which the operations
  differ in what must agree: the operation, the dtypes and, except for ops whose per-rank sizes
  legitimately differ (``all_to_all(_single)`` in MoE routing, ``scatter``, ``gather``), the
  sizes. For ``all_to_all`` the total sent must equal the total received. The minority diverged;
  with an even split, the rank whose operation breaks the pattern the group followed so far;
  with no pattern to go by, it is a **tie** and both sides are named, never one by rank number;
- else ranks that stopped before a collective others issued are **missing** from it. A missing
  rank that itself waits in another group's collective is a victim, not the cause: the culprit
  is the rank missing somewhere that waits nowhere (the end of the wait-for chain);
- else every rank issued the same last collective: it is either complete or everyone waits in
  it (**agree**).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from areal_watchdog.common.rankset import ranks_phrase
from areal_watchdog.diagnose.phrases import verb

SIZE_FREE = frozenset(
    {"all_to_all", "all_to_all_single", "alltoall", "alltoall_base", "scatter", "gather"}
)
ALL_TO_ALL = frozenset({"all_to_all", "all_to_all_single", "alltoall", "alltoall_base"})
_HIDDEN_DESCS = ("", "undefined")


@dataclass(frozen=True)
class Op:
    """One collective as issued by one rank."""

    seq: int
    name: str  # "all_reduce" (the backend prefix dropped)
    sizes: str
    dtypes: str
    sent: int  # elements in, over every input tensor
    received: int  # elements out

    @property
    def key(self) -> tuple[str, str, str]:
        """What must agree across the ranks of one collective."""
        if self.name in SIZE_FREE:
            return (self.name, "*", self.dtypes)
        return (self.name, self.sizes, self.dtypes)

    def label(self) -> str:
        return f"#{self.seq} {self.name}"


@dataclass
class GroupFinding:
    """What the trace says about one process group."""

    group: str
    ranks: list[int]
    first_incomplete: int | None  # sequence id of the collective the finding is about
    culprit_ranks: list[int]
    kind: str  # agree | missing | mismatch | complete
    description: str
    table: list[str] = field(default_factory=list)  # "ranks 0-2, 4-7 at #119 barrier"
    tie: bool = False  # mismatch: the sides are equal and no history tells them apart
    waiting: list[int] = field(default_factory=list)  # missing: the ranks that wait in it


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

    @property
    def decisive_mismatch(self) -> GroupFinding | None:
        """The first mismatch that names ranks and is not a tie: strong enough to overrule."""
        return next(
            (g for g in self.groups if g.kind == "mismatch" and g.culprit_ranks and not g.tie),
            None,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "groups": [dict(g.__dict__) for g in self.groups],
            "ranks_without_trace": self.ranks_without_trace,
            "culprit_ranks": self.culprit_ranks,
        }


@dataclass
class _RankGroup:
    """One rank's view of one process group."""

    ops: dict[int, Op] = field(default_factory=dict)
    pg_id: str | None = None  # this rank's own id of the group (what keys pg_status)
    finished: set[int] = field(default_factory=set)  # sequence ids marked retired or completed


def analyse(dumps: dict[int, dict[str, Any]], world_size: int) -> CollectiveEvidence:
    """Analyse every rank's dump (``dumps[rank]``); ranks without one are listed as such."""
    views = {rank: _rank_groups(dump) for rank, dump in dumps.items()}
    members = _members(dumps, views)
    findings = []
    for group in sorted(members, key=_group_order):
        default_id = "0" if group.split(" ", 1)[0] == "0" else None
        per_rank = {
            r: views.get(r, {}).get(group) or _RankGroup(pg_id=default_id)
            for r in sorted(members[group])
        }
        if not any(view.ops for view in per_rank.values()):
            continue  # listed in pg_config, never used
        statuses = {r: _status(dumps.get(r, {}), view.pg_id) for r, view in per_rank.items()}
        last = {r: _last_issued(statuses[r], view) for r, view in per_rank.items()}
        done = {r: _completed(statuses[r], view, last[r]) for r, view in per_rank.items()}
        findings.append(_analyse_group(group, per_rank, last, done))
    _blame_chain_ends(findings)
    missing = [r for r in range(world_size) if r not in dumps]
    return CollectiveEvidence(findings, missing)


def _group_order(label: str) -> tuple[int, str]:
    name = label.split(" ", 1)[0]
    return (int(name), label) if name.isdigit() else (1 << 30, label)


def _rank_groups(dump: dict[str, Any]) -> dict[str, _RankGroup]:
    """Collectives of one rank by group name and sequence id (P2P entries skipped)."""
    groups: dict[str, _RankGroup] = defaultdict(_RankGroup)
    for entry in dump.get("entries") or []:
        if entry.get("is_p2p"):
            continue
        name, desc = _group_of(entry)
        view = groups[_label(name, desc)]
        if entry.get("pg_id") is not None:
            view.pg_id = str(entry["pg_id"])
        seq = _int(entry.get("collective_seq_id"), -1)
        view.ops[seq] = Op(
            seq,
            str(entry.get("profiling_name", "?")).split(":", 1)[-1],
            str(entry.get("input_sizes")),
            "/".join(sorted({str(d) for d in _dtypes(entry)})),
            _numel(entry.get("input_sizes")),
            _numel(entry.get("output_sizes")),
        )
        if entry.get("retired") or entry.get("state") == "completed":
            view.finished.add(seq)
    return groups


def _group_of(entry: dict[str, Any]) -> tuple[str, str]:
    group = entry.get("process_group") or ["?"]
    name = str(group[0])
    desc = str(group[1]) if len(group) > 1 and group[1] is not None else ""
    return name, desc


def _label(name: str, desc: str) -> str:
    """``1`` or ``1 (tp)``: the group name all ranks share, with the user's description."""
    return name if desc in _HIDDEN_DESCS or desc == name else f"{name} ({desc})"


def _dtypes(entry: dict[str, Any]) -> list[Any]:
    return list(entry.get("input_dtypes") or []) + list(entry.get("output_dtypes") or [])


def _numel(sizes: Any) -> int:
    total = 0
    for shape in sizes or []:
        count = 1
        for dim in shape or []:
            count *= _int(dim, 0)
        total += count
    return total


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _members(
    dumps: dict[int, dict[str, Any]], views: dict[int, dict[str, _RankGroup]]
) -> dict[str, set[int]]:
    """Each group's member ranks: ranks that recorded it, the ranks ``pg_config`` lists (NCCL),
    and every rank with a dump for the default group."""
    members: dict[str, set[int]] = defaultdict(set)
    labels: dict[str, str] = {}
    for rank, groups in views.items():
        for label in groups:
            members[label].add(rank)
            labels[label.split(" ", 1)[0]] = label
    for dump in dumps.values():
        for name, config in (dump.get("pg_config") or {}).items():
            listed = [int(r) for r in re.findall(r"\d+", str((config or {}).get("ranks", "")))]
            if name and listed:
                members[labels.get(str(name), str(name))].update(listed)
    default = next((label for label in members if label.split(" ", 1)[0] == "0"), None)
    if default is not None:
        members[default].update(dumps)
    return members


def _status(dump: dict[str, Any], pg_id: str | None) -> dict[str, Any]:
    """The rank's ``pg_status`` entry for its own ``pg_id`` (keys are ints or strings)."""
    if pg_id is None:
        return {}
    table = {str(k): v for k, v in (dump.get("pg_status") or {}).items()}
    status = table.get(pg_id)
    return status if isinstance(status, dict) else {}


def _last_issued(status: dict[str, Any], view: _RankGroup) -> int:
    """The last collective the rank issued in the group: ``last_enqueued_collective``, else
    its newest entry, else 0 (none)."""
    enqueued = _int(status.get("last_enqueued_collective"), -1)
    return max([enqueued, *view.ops, 0])


def _completed(status: dict[str, Any], view: _RankGroup, seq: int) -> bool:
    done = _int(status.get("last_completed_collective"), -1)
    return done >= seq or seq in view.finished


def _analyse_group(
    group: str, views: dict[int, _RankGroup], last: dict[int, int], done: dict[int, bool]
) -> GroupFinding:
    members = sorted(views)
    ops = {r: v.ops for r, v in views.items()}
    table = _table(ops)
    divergence = _first_divergence(group, ops)
    if divergence is not None:
        divergence.table = table
        return divergence
    if len(set(last.values())) > 1:  # some ranks stopped before a collective others issued
        target = min(last.values()) + 1
        waiting = sorted(r for r, n in last.items() if n >= target)
        behind = sorted(r for r, n in last.items() if n < target)
        name = next((ops[r][target].name for r in waiting if target in ops[r]), "a collective")
        return GroupFinding(
            group,
            members,
            target,
            behind,
            "missing",
            f"{ranks_phrase(behind)} never issued collective #{target} ({name}) of group "
            f"{group} that {ranks_phrase(waiting)} {verb(waiting, 'wait')} in",
            table,
            waiting=waiting,
        )
    final = next(iter(last.values()), 0)
    name = next((ops[r][final].name for r in members if final in ops[r]), "collective")
    complete = all(done.values())
    return GroupFinding(
        group,
        members,
        None if complete else final,
        [],
        "complete" if complete else "agree",
        f"group {group}: every collective issued was completed"
        if complete
        else f"every rank of group {group} issued collective #{final} ({name})",
        table,
    )


def _first_divergence(group: str, ops: dict[int, dict[int, Op]]) -> GroupFinding | None:
    """The first sequence id every rank recorded at which what must agree does not."""
    recorded = {rank: by_seq for rank, by_seq in ops.items() if by_seq}
    if len(recorded) < 2:
        return None
    for seq in sorted(set.intersection(*(set(by_seq) for by_seq in recorded.values()))):
        present = {rank: by_seq[seq] for rank, by_seq in recorded.items()}
        variants = Counter(op.key for op in present.values())
        if len(variants) > 1:
            culprits, tie = _diverging(present, variants, ops, seq)
            others = sorted(set(present) - set(culprits)) or sorted(present)
            text = (
                f"at collective #{seq} of group {group}, {_sides(present)}: a tie, nothing in "
                f"the record says which side broke the pattern"
                if tie
                else f"at collective #{seq} of group {group}, {ranks_phrase(culprits)} issued "
                f"{_describe(present, culprits)} while {ranks_phrase(others)} issued "
                f"{_describe(present, others)}"
            )
            return GroupFinding(group, sorted(ops), seq, culprits, "mismatch", text, tie=tie)
        first = next(iter(present.values()))
        if first.name in ALL_TO_ALL and len(present) == len(ops):  # totals need every member
            sent = sum(op.sent for op in present.values())
            received = sum(op.received for op in present.values())
            if sent != received:
                return GroupFinding(
                    group,
                    sorted(ops),
                    seq,
                    [],
                    "mismatch",
                    f"at collective #{seq} of group {group} ({first.name}), the ranks send "
                    f"{sent} elements in total but expect {received}: the split sizes disagree, "
                    f"and the record cannot tell which rank's are wrong",
                )
    return None


def _sides(present: dict[int, Op]) -> str:
    by_key: dict[tuple[str, str, str], list[int]] = defaultdict(list)
    for rank, op in present.items():
        by_key[op.key].append(rank)
    return " while ".join(
        f"{ranks_phrase(ranks)} issued {_describe(present, ranks)}" for ranks in by_key.values()
    )


def _describe(present: dict[int, Op], ranks: list[int]) -> str:
    """``all_reduce of [[1]] Int`` for the operation(s) those ranks issued."""
    kinds = sorted({(present[r].name, present[r].sizes, present[r].dtypes) for r in ranks})
    return " / ".join(f"{name} of {sizes} {dtypes}" for name, sizes, dtypes in kinds) or "nothing"


def _diverging(
    present: dict[int, Op], variants: Counter, ops: dict[int, dict[int, Op]], target: int
) -> tuple[list[int], bool]:
    """(the ranks that diverged, whether it is a tie)."""
    ranked = variants.most_common()
    if ranked[0][1] > ranked[1][1]:
        return sorted(r for r, op in present.items() if op.key != ranked[0][0]), False
    expected = _expected_next(ops, target)
    if expected is not None:
        odd = sorted(r for r, op in present.items() if op.key != expected)
        if 0 < len(odd) < len(present):
            return odd, False
    top = ranked[0][1]
    tied = {key for key, n in ranked if n == top}
    return sorted(r for r, op in present.items() if op.key in tied), True


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


def _blame_chain_ends(findings: list[GroupFinding]) -> None:
    """A rank missing from one collective while it waits in another is a victim: keep as
    culprits the ranks that wait nowhere. If every missing rank waits somewhere (the ranks wait
    for each other across groups), all of them stay named."""
    waiting = {r for g in findings if g.kind == "missing" for r in g.waiting}
    for finding in findings:
        if finding.kind != "missing":
            continue
        free = [r for r in finding.culprit_ranks if r not in waiting]
        victims = [r for r in finding.culprit_ranks if r in waiting]
        if free and victims:
            finding.culprit_ranks = free
            finding.description += (
                f" ({ranks_phrase(victims)} {verb(victims, 'wait')} in another group's collective)"
            )


def _table(ops: dict[int, dict[int, Op]]) -> list[str]:
    """Each rank's last issued collective, ranks grouped: "ranks 0-2 at #119 barrier"."""
    rows: dict[str, list[int]] = defaultdict(list)
    for rank, by_seq in ops.items():
        last = by_seq[max(by_seq)] if by_seq else None
        rows[last.label() if last else "no collective recorded"].append(rank)
    ordered = sorted(rows.items(), key=lambda item: (-len(item[1]), min(item[1])))
    return [f"{ranks_phrase(ranks)} at {label}" for label, ranks in ordered]
