"""The typed parts of a ``compare run`` result record, and the plan of one (workload, implementation) pair.

The runner (``runner.py``) works in three steps (docs/compare.md, "The runner's structure"):

* **plan**: per (workload, implementation) pair, everything decided before anything runs: whether the
  implementation applies at all (``n/a``: no record), its :class:`ResultRecord` with the layer-1 prediction,
  the launch plan and layer 2, and its refusals (:class:`Refusal`): the implementation's own (``unsupported``)
  and the static skips (too large for CPU interpret mode, predicted floor over ``--budget-s``);
* **execute**: one :class:`PairPlan` -> one record (inputs, first call, agreement, timing, rates);
* **summarize**: per workload, over the finished records (speed-ups, twin agreement), then the table.

:meth:`ResultRecord.to_json` is the record's JSON object, key for key and in the same order as the schema in
``records.py`` and docs/compare.md describe; ``metrics``, ``agreement``, ``prediction`` and ``impl`` stay
plain dicts (their keys depend on the machine, the clock and the workload) and ``to_json`` shares them rather
than copying, so a step that fills them after ``to_json`` (the per-workload summary) fills the record.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["Refusal", "ResultRecord", "PairPlan"]


def says_out_of_memory(text: str) -> bool:
    """Whether an error's text says the device ran out of memory (or of another resource): the runner's ``oom``
    status, and which workloads a ``--jobs`` run reruns alone (``lanes.rerun_names``)."""
    s = text.lower()
    return ("out of memory" in s or "resource_exhausted" in s or "outofmemory" in s or "out of resource" in s
            or "outofresources" in s)


@dataclasses.dataclass(frozen=True)
class Refusal:
    """Why a pair is recorded without running: a status other than ``ok`` and its reason."""

    status: str  # "unsupported" (the implementation's own refusal) or "skipped" (a budget, the CPU size gate)
    reason: str | None


@dataclasses.dataclass
class ResultRecord:
    """One ``type: "result"`` record while the runner fills it."""

    head: dict[str, Any]  # schema, type, run_id, env (the fields every record of a run starts with)
    workload: dict[str, Any]
    impl: dict[str, Any]  # Impl.as_dict() + generation, config, plan (+ prepared_notes once prepared)
    repro: str
    status: str = "ok"
    reason: str | None = None
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    agreement: dict[str, Any] = dataclasses.field(default_factory=dict)
    prediction: dict[str, Any] | None = None
    has_prediction: bool = False  # a record refused by a compare error carries no prediction key at all

    def set_prediction(self, pred: dict[str, Any] | None) -> None:
        self.prediction, self.has_prediction = pred, True

    def refuse(self, refusal: Refusal) -> ResultRecord:
        self.status, self.reason = refusal.status, refusal.reason
        return self

    def fail(self, status: str, reason: str | None) -> ResultRecord:
        self.status, self.reason = status, reason
        return self

    def to_json(self) -> dict[str, Any]:
        out = {**self.head, "workload": self.workload, "impl": self.impl, "status": self.status,
               "reason": self.reason, "metrics": self.metrics, "agreement": self.agreement, "repro": self.repro}
        if self.has_prediction:
            out["prediction"] = self.prediction
        return out


@dataclasses.dataclass
class PairPlan:
    """A (workload, implementation) pair as planned: its record so far and what stops it from running.

    ``refusal`` applies at once (the implementation refused the workload); ``skip`` applies after the
    whole-run budget check (``--max-run-s``), which is a matter of time elapsed and so decided at execution."""

    workload: Any  # workloads.Workload
    impl: Any  # schema.Impl
    record: ResultRecord
    basis: dict[str, Any] = dataclasses.field(default_factory=dict)  # the prediction the rates are measured against
    refusal: Refusal | None = None
    skip: Refusal | None = None
