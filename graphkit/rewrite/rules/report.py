"""What applying rules reports: a check's verdict, per-rule counts and reasons, op-count changes."""

from __future__ import annotations

import collections
import operator
from collections.abc import Iterable
from dataclasses import dataclass, field

import onnx

from graphkit.rewrite.graph.walk import holds_graphs

__all__ = ["MatchResult", "OpDelta", "RuleReport"]


class MatchResult:
    """Success, or failure with a reason. Falsy when failed."""

    def __init__(self, ok: bool = True, reason: str = "") -> None:
        self.ok = ok
        self.reason = reason

    def fail(self, reason: str) -> "MatchResult":
        """A failed result saying why: ``return MatchResult().fail("x and y are the same")``."""
        return MatchResult(False, reason)

    def __bool__(self) -> bool:
        return self.ok

    def __repr__(self) -> str:
        return "MatchResult(ok)" if self.ok else f"MatchResult(fail: {self.reason})"


@dataclass
class RuleReport:
    """Per rule: rewrites, matches, and why it did not apply elsewhere.

    ``reasons`` holds one line per node that was a candidate and did not match (in the
    final round, so nothing repeats); ``failures`` counts them by kind.
    """

    applied: dict[str, int] = field(default_factory=dict)
    matched: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, list[str]] = field(default_factory=dict)
    failures: dict[str, collections.Counter] = field(default_factory=dict)

    def fail(self, rule: str, text: str, generic: str | None = None) -> None:
        """Record why ``rule`` did not apply somewhere: ``text`` names the place, ``generic``
        (default ``text``) is what the summary counts."""
        self.reasons.setdefault(rule, []).append(text)
        self.failures.setdefault(rule, collections.Counter())[text if generic is None else generic] += 1

    def apply(self, rule: str, count: int = 1) -> None:
        """Record that ``rule`` matched and rewrote ``count`` places."""
        self.applied[rule] = self.applied.get(rule, 0) + count
        self.matched[rule] = self.matched.get(rule, 0) + count

    def merge_round(self, other: "RuleReport") -> None:
        """Add one round's rewrites (each also a match)."""
        for name, n in other.applied.items():
            self.applied[name] = self.applied.get(name, 0) + n
            self.matched[name] = self.matched.get(name, 0) + n

    def merge_final(self, other: "RuleReport") -> None:
        """Add the last round a rule ran in: its reasons, and the matches it did not rewrite
        (vetoed by check, overlapping), counted once however many rounds saw them."""
        for name, n in other.matched.items():
            self.matched[name] = self.matched.get(name, 0) + n - other.applied.get(name, 0)
        for name, lines in other.reasons.items():
            self.reasons.setdefault(name, []).extend(lines)
        for name, counts in other.failures.items():
            self.failures.setdefault(name, collections.Counter()).update(counts)

    def explain(self, all: bool = False) -> str:
        """One summary per rule (rewrites, matches, top reasons with counts); ``all``: every node."""
        lines = []
        for name in sorted(set(self.applied) | set(self.reasons) | set(self.matched)):
            applied = self.applied.get(name, 0)
            matched = max(self.matched.get(name, 0), applied)
            missed = len(self.reasons.get(name, []))
            lines.append(f"rule {name}: applied {applied}x ({matched} matched, {missed} not)")
            if all:
                lines += [f"  no match: {reason}" for reason in self.reasons.get(name, [])]
                continue
            top = self.failures.get(name, collections.Counter()).most_common()
            for reason, n in top[:5]:
                lines.append(f"  {n}x no match: {reason}")
            if len(top) > 5:
                lines.append(f"  ... {sum(n for _, n in top[5:])} more of {len(top) - 5} other kinds "
                             f"(--explain=all lists every node)")
        return "\n".join(lines)


_ATTRIBUTES, _DOMAIN, _OP_TYPE = (operator.attrgetter(f) for f in ("attribute", "domain", "op_type"))


@dataclass
class OpDelta:
    """How applying rules changed the model's op counts: (domain, op_type) -> change. Not
    ``exact`` where it cannot tell (a graph pass ran; a node holding subgraphs came or went):
    count the model then."""

    counts: collections.Counter = field(default_factory=collections.Counter)
    exact: bool = True
    # Every rewrite so far overwrote nodes where they were: no node list rebuilt (the model's
    # graphs, node lists and graph inputs/outputs are the objects they were).
    in_place: bool = True

    def replaced(self, old: Iterable[onnx.NodeProto], new: Iterable[onnx.NodeProto]) -> None:
        """``old`` nodes left the model, ``new`` ones came."""
        if not self.exact:
            return
        old, new = list(old), list(new)
        for nodes in (old, new):  # attributes read in bulk: most nodes have none
            if any(map(holds_graphs, filter(_ATTRIBUTES, nodes))):
                self.exact = False
                return
        self.counts.subtract(collections.Counter(zip(map(_DOMAIN, old), map(_OP_TYPE, old))))
        self.counts.update(zip(map(_DOMAIN, new), map(_OP_TYPE, new)))
