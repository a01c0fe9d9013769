"""PodDisruptionBudgets as kube-scheduler's preemption counts them (pure; the listing is ``extender/pdb_lister.py``).

kube-scheduler (``filterPodsWithPDBViolation``) goes through a victim set pod by pod: for every budget in the pod's
namespace whose selector matches the pod's labels (a pod without labels, and a budget with an empty or missing
selector, match nothing; a pod already in the budget's ``status.disruptedPods`` is not counted again), it takes one
from the budget's ``status.disruptionsAllowed``; the pod violates a budget when that goes below zero.

:func:`violations` counts, for a victim set, per budget the victims it matches beyond what it allows
(``max(0, matched - disruptionsAllowed)``) summed over the budgets. When each pod matches at most one budget (the
usual case) that is exactly kube-scheduler's number of violating pods; a pod matched by two exhausted budgets counts
twice here (once in kube-scheduler), which only makes kelvin avoid it more.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Operator = Literal["In", "NotIn", "Exists", "DoesNotExist"]
_OPERATORS: frozenset[str] = frozenset({"In", "NotIn", "Exists", "DoesNotExist"})


class BudgetError(ValueError):
    """A PodDisruptionBudget object kelvin cannot read; the message names the field."""


@dataclass(frozen=True, slots=True)
class Expression:
    key: str
    operator: Operator
    values: frozenset[str]

    def matches(self, labels: Mapping[str, str]) -> bool:
        has = self.key in labels
        if self.operator == "In":
            return has and labels[self.key] in self.values
        if self.operator == "NotIn":
            return not has or labels[self.key] not in self.values
        if self.operator == "Exists":
            return has
        return not has


@dataclass(frozen=True, slots=True)
class Budget:
    """One PodDisruptionBudget: where it applies and how many more disruptions it allows."""

    namespace: str
    name: str
    match_labels: tuple[tuple[str, str], ...]
    expressions: tuple[Expression, ...]
    disruptions_allowed: int
    disrupted: frozenset[str] = frozenset()
    """Pod names in ``status.disruptedPods``: evictions the API server already counted."""

    @property
    def empty(self) -> bool:
        return not self.match_labels and not self.expressions

    def matches(self, namespace: str, name: str, labels: Mapping[str, str]) -> bool:
        """Whether evicting pod ``namespace/name`` with ``labels`` takes one from this budget."""
        if namespace != self.namespace or not labels or self.empty or name in self.disrupted:
            return False
        return all(labels.get(k) == v for k, v in self.match_labels) and all(
            e.matches(labels) for e in self.expressions
        )


def _mapping(v: Any, where: str) -> Mapping[str, Any]:
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise BudgetError(f"{where}: expected an object, got {type(v).__name__}")
    return v


def _str(v: Any, where: str) -> str:
    if not isinstance(v, str) or not v:
        raise BudgetError(f"{where}: expected a non-empty string, got {v!r}")
    return v


def parse_budget(obj: Mapping[str, Any]) -> Budget:
    """A ``policy/v1`` PodDisruptionBudget (API JSON). Raises :class:`BudgetError` naming the field."""
    meta = _mapping(obj.get("metadata"), "metadata")
    spec = _mapping(obj.get("spec"), "spec")
    status = _mapping(obj.get("status"), "status")
    sel = _mapping(spec.get("selector"), "spec.selector")
    labels = _mapping(sel.get("matchLabels"), "spec.selector.matchLabels")
    for k, v in labels.items():
        if not isinstance(v, str):
            raise BudgetError(f"spec.selector.matchLabels.{k}: expected a string, got {v!r}")
    match_labels = tuple(sorted((str(k), str(v)) for k, v in labels.items()))
    raw_exprs = sel.get("matchExpressions") or []
    if not isinstance(raw_exprs, list):
        raise BudgetError("spec.selector.matchExpressions: expected a list")
    exprs = []
    for i, e in enumerate(raw_exprs):
        where = f"spec.selector.matchExpressions[{i}]"
        e = _mapping(e, where)
        op = e.get("operator")
        if op not in _OPERATORS:
            raise BudgetError(f"{where}.operator: {op!r} is not one of In, NotIn, Exists, DoesNotExist")
        values = e.get("values") or []
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise BudgetError(f"{where}.values: expected a list of strings")
        if op in ("In", "NotIn") and not values:
            raise BudgetError(f"{where}.values: {op} needs at least one value")
        exprs.append(Expression(_str(e.get("key"), f"{where}.key"), op, frozenset(values)))
    allowed = status.get("disruptionsAllowed", 0)
    if not isinstance(allowed, int) or isinstance(allowed, bool):
        raise BudgetError(f"status.disruptionsAllowed: expected an integer, got {allowed!r}")
    disrupted = _mapping(status.get("disruptedPods"), "status.disruptedPods")
    return Budget(
        namespace=_str(meta.get("namespace"), "metadata.namespace"),
        name=_str(meta.get("name"), "metadata.name"),
        match_labels=match_labels,
        expressions=tuple(exprs),
        disruptions_allowed=allowed,
        disrupted=frozenset(str(k) for k in disrupted),
    )


def matching(budgets: Sequence[Budget], pod_key: str, labels: Mapping[str, str]) -> tuple[int, ...]:
    """Indices of the budgets that evicting pod ``pod_key`` (``namespace/name``) takes one from."""
    namespace, _, name = pod_key.partition("/")
    return tuple(i for i, b in enumerate(budgets) if b.matches(namespace, name, labels))


class BudgetIndex:
    """A list of budgets, looked up by namespace and label: a pod is only tested against the budgets of its
    namespace whose first ``matchLabels`` pair it carries, and those of its namespace with no ``matchLabels``."""

    def __init__(self, budgets: Iterable[Budget]) -> None:
        self.budgets = tuple(budgets)
        self.allowed = tuple(b.disruptions_allowed for b in self.budgets)
        self._by_label: dict[tuple[str, str, str], list[int]] = {}
        self._scan: dict[str, list[int]] = {}
        for i, b in enumerate(self.budgets):
            if b.empty:
                continue  # matches nothing
            if b.match_labels:
                k, v = b.match_labels[0]
                self._by_label.setdefault((b.namespace, k, v), []).append(i)
            else:
                self._scan.setdefault(b.namespace, []).append(i)

    def __len__(self) -> int:
        return len(self.budgets)

    def matching(self, pod_key: str, labels: Mapping[str, str]) -> tuple[int, ...]:
        """Indices of the budgets that evicting pod ``pod_key`` (``namespace/name``) takes one from."""
        namespace, _, name = pod_key.partition("/")
        tried = list(self._scan.get(namespace, ()))
        for k, v in labels.items():
            tried.extend(self._by_label.get((namespace, k, v), ()))
        return tuple(sorted(i for i in tried if self.budgets[i].matches(namespace, name, labels)))


def violations(hits: Iterable[int], allowed: Sequence[int]) -> int:
    """PDB violations of a victim set: ``hits`` the budget index of every (victim, matching budget) pair."""
    counts: dict[int, int] = {}
    for b in hits:
        counts[b] = counts.get(b, 0) + 1
    return sum(max(0, n - allowed[b]) for b, n in counts.items())
