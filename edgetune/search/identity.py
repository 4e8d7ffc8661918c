"""What a study is for, and resuming one: the same study, or one to score again with other steps to target.

A new study records its identity (:class:`StudyIdentity`: the space, objective, budget, workload and device;
how each setting is measured, :data:`PROTOCOL_FLAGS` (a study made before they were kept records its next
resume's); the cost objective's eta; the user's runs' median steps to target where they replace the law) and the law's
parameters in its attributes (:func:`~edgetune.search.records.write_identity`). A resumed study must be for
the same, but for its steps to target: the hardware measurements of a study made with the law, or with other
runs, still hold, so a sampler that ranks measurements (the guided samplers, :func:`ranks_measurements`)
scores every trial again with the new steps (:func:`~edgetune.search.records.read_records` does it on every
read) and the study records that it did (:func:`~edgetune.search.records.write_rescored`). The values Optuna
was told (what ``optuna-dashboard`` shows) stay the first ones, so a sampler that ranks them (Optuna's own)
may not resume such a study: it would rank trials scored two ways.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna

from edgetune.log import get_logger
from edgetune.search import records
from edgetune.search.efficiency import TargetModel, ZeusCost
from edgetune.search.measurement import MeasurementProtocol
from edgetune.search.prior import NAME_SEP
from edgetune.search.runs_target import RunsTarget
from edgetune.search.samplers import AUTO_SAMPLER
from edgetune.search.space import SearchSpace
from edgetune.search.storage import SearchError, redact

__all__ = ["PROTOCOL_FLAGS", "StudyIdentity", "ranks_measurements"]

_log = get_logger(__name__)


def ranks_measurements(sampler: str) -> bool:
    """Whether sampler ``sampler`` (a config name) ranks trials by their measurements (the guided samplers),
    not by the objective values the study was told (Optuna's own): only then may the steps to target change
    on a resume."""
    return (AUTO_SAMPLER if sampler == "auto" else sampler) == "guided"


def _steps_text(steps: Mapping[Any, Any] | None, law: Mapping[str, Any] | None) -> str:
    """A study's steps to target in words: the runs' medians (identity ``steps_to_target``), else the law's
    B_noise."""
    if not steps:
        b_noise = (law or {}).get("b_noise")
        return f"the noise-scale law's steps to target (B_noise {b_noise:.4g})" if isinstance(b_noise, float) \
            else "the noise-scale law's steps to target"
    medians = ", ".join(f"b {b}: {'missed' if s is None else f'{s:.4g}'}" for b, s in steps.items())
    return f"your runs' median steps to target ({medians})"


#: the flag that sets each part of a study's budget rule (``records.read_budget_rule``), for messages
_RULE_FLAGS = {"tolerance": "--tolerance", "window_s": "--window", "guard_sigma": "--guard-sigma"}
#: the identity fields of the measurement protocol (``MeasurementProtocol``), each set by its flag: what a stored
#: window means (how long it ran, after how many warm-up steps); ``real_steps`` is not one of them (it changes no
#: time or power: the twin times every step alike, and hardware runs every step for real)
PROTOCOL_FLAGS = {"warmup_steps": "--warmup-steps", "measure_steps": "--measure-steps", "measure_s": "--measure-s"}
#: the flags that set each field of a study's identity, for messages (a value is named after the flag)
_IDENTITY_FLAGS = {"objective": "--objective", "budget_w": "--budget", "workload": "--workload", "device": "--device",
                   "eta": "--eta", "torch_device": "--torch-device", "space": "--batch-sizes, --knobs or space.values",
                   "steps_to_target": "--steps-to-target", **PROTOCOL_FLAGS}
#: an identity field's value where a study does not record it (a study trained on the CPU records no torch_device)
_IDENTITY_DEFAULTS = {"torch_device": "cpu"}
#: how a study is started anew instead of resuming one, where the caller does not say (:meth:`StudyIdentity.check`)
START_ANEW = "another --study-name or --output"


def _value_text(value: Any) -> str:
    """A field's value as given on the command line (a float without trailing zeros: ``2``, ``0.5``)."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def _flag_value(key: str, value: Any) -> str:
    """A field's flag and value as given on the command line: ``--measure-s 2``."""
    return f"{_IDENTITY_FLAGS.get(key, key)} {_value_text(value)}"


def _made_with(stored: Mapping[str, Any], fields: Mapping[str, Any], diff: Sequence[str]) -> str:
    """What a study was made with, against what this search asks, for the fields ``diff``: ``--budget 12 (not
    10)``; the space, the runs and a field the study lacks by their flags alone."""
    parts = []
    for key in diff:
        flag = _IDENTITY_FLAGS.get(key, key)
        default = _IDENTITY_DEFAULTS.get(key)
        was, now = stored.get(key, default), fields.get(key, default)
        if key == "space" and isinstance(was, Mapping) and isinstance(now, Mapping):
            parts.append(_space_made_with(was, now))
        elif key in ("space", "steps_to_target") or was is None or now is None:
            parts.append(f"another {flag}" if key == "space" else f"a different {flag}")
        else:
            parts.append(f"{flag} {_value_text(was)} (not {_value_text(now)})")
    return " and ".join(parts)

def _space_made_with(was: Mapping[str, Any], now: Mapping[str, Any]) -> str:
    """How a study's space (``SearchSpace.to_dict``) differs from this search's, by the flags that set it:
    ``--batch-sizes 8,16 (not 16,32)``, ``--knobs gpu_freq (not gpu_freq,emc_freq)``, the values of a knob."""
    def listed(values: Any) -> str:
        return ",".join(_value_text(v) for v in values) if isinstance(values, list) else str(values)

    parts = []
    if was.get("batch_sizes") != now.get("batch_sizes"):
        parts.append(f"--batch-sizes {listed(was.get('batch_sizes'))} (not {listed(now.get('batch_sizes'))})")
    knobs_was, knobs_now = dict(was.get("knobs") or {}), dict(now.get("knobs") or {})
    if list(knobs_was) != list(knobs_now):
        parts.append(f"--knobs {','.join(knobs_was) or 'none'} (not {','.join(knobs_now) or 'none'})")
    else:
        moved = [k for k in knobs_was if knobs_was[k] != knobs_now[k]]
        if moved:
            parts.append(f"other values of {', '.join(moved)} (space.values, or the power mode's caps)")
    if was.get("rows") != now.get("rows"):
        parts.append(f"a table of {was.get('rows')} rows (not {now.get('rows')})")
    return " and ".join(parts) or "another --batch-sizes, --knobs or space.values"


#: relative difference under which two of the law's numbers are one: a B_noise measured again on a GPU (a
#: resumed search, each worker of a fleet) differs in its last digits from run to run, far inside the law's 5%
LAW_SAME_REL = 1e-3


def _same_numbers(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """The same keys and values, numbers within :data:`LAW_SAME_REL`, NaN equal to NaN (a trace table's target
    has no law)."""
    def same(x: Any, y: Any) -> bool:
        if isinstance(x, float) and isinstance(y, float):
            return (math.isnan(x) and math.isnan(y)) or math.isclose(x, y, rel_tol=LAW_SAME_REL)
        return x == y
    return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)


@dataclass(frozen=True)
class StudyIdentity:
    """What a search's study is for.

    Attributes:
        fields: the identity a study records: ``space``, ``objective``, ``budget_w``, ``workload``, ``device``;
            ``eta`` for the cost objective only (other studies' identities stay as they were),
            ``steps_to_target`` where the user's runs replace the law, and ``torch_device`` where training
            runs elsewhere than on the CPU (a GPU's steps are not the CPU's; studies trained on the CPU, the
            twin's and every older one, keep their identity); the measurement protocol's
            :data:`PROTOCOL_FLAGS` fields (``warmup_steps``, ``measure_steps``, ``measure_s``) where a
            protocol is given (a study made before they were kept records them on its next resume).
        law: the law's parameters (``s_min``, ``b_noise``), recorded beside it.
        is_law: whether the search's steps to target are the law's.
    """

    fields: dict[str, Any]
    law: dict[str, Any] = field(default_factory=dict)
    is_law: bool = True

    @classmethod
    def of(cls, *, space: SearchSpace, objective: str, budget_w: float | None, workload: str, device: str,
           target: TargetModel, cost: ZeusCost | None = None, torch_device: str = "cpu",
           protocol: MeasurementProtocol | None = None) -> StudyIdentity:
        """The identity of a search of ``space`` for ``workload`` (name) on ``device`` (name), training on
        ``torch_device``, measuring each setting by ``protocol``."""
        fields = {"space": space.to_dict(), "objective": objective, "budget_w": budget_w, "workload": workload,
                  "device": device}
        if protocol is not None:
            # a window's length and warm-up make its noise and its board temperature what they are: a study's
            # pick and its certification of the budget compare its windows, which must be measured alike
            fields.update(warmup_steps=int(protocol.warmup_steps), measure_steps=int(protocol.measure_steps),
                          measure_s=float(protocol.measure_s))
        if cost is not None:
            fields["eta"] = cost.eta
        if torch_device != "cpu":
            fields["torch_device"] = torch_device
        if isinstance(target, RunsTarget):
            # the user's runs (efficiency.steps_to_target): each trial's time and energy to target are theirs, so
            # a study resumed with other runs, or with the law, would rank trials scored two ways
            fields["steps_to_target"] = target.describe()["steps_to_target"]
        return cls(fields, {"s_min": target.s_min, "b_noise": target.b_noise}, target.is_law)

    def check(self, study: optuna.Study, *, storage_url: str, sampler: str, tolerance: float,
              window_s: float, guard_sigma: float, start_anew: str = START_ANEW) -> None:
        """Record this identity in a new study; check a resumed one is for the same, and where only its steps
        to target differ and ``sampler`` ranks measurements, score it again (module docs). A refusal names
        ``start_anew``, the flags that give this search a study of its own instead (where ``--storage`` names
        the storage, another ``--output`` opens the same study again: another ``--study-name`` does it).

        Raises:
            SearchError: the study was made for something else, or with other steps to target (or scored again
                with them) and ``sampler`` ranks the values Optuna was told (one line, with the way out).
        """
        rule = {"tolerance": tolerance, "window_s": window_s, "guard_sigma": guard_sigma}
        stored = records.read_identity(study)
        if stored is None:
            records.write_identity(study, self.fields, target=self.law, **rule)
            return
        where = f"study {study.study_name!r} in {redact(storage_url)}"
        shown = redact(storage_url)
        password = ", with the password in place of ***" if shown != storage_url else ""  # never printed
        prior_hint = (f"(--prior '{shown}{NAME_SEP}{study.study_name}'{password} starts it from this "
                      f"study's measurements)")
        # its trials' verdicts on the budget were made under its rule: another one would mix two
        changed = {k: v for k, v in records.read_budget_rule(study).items() if not math.isclose(v, rule[k])}
        if changed:
            was = ", ".join(f"{_RULE_FLAGS[k]} {v:g}" for k, v in changed.items())
            now = ", ".join(f"{_RULE_FLAGS[k]} {rule[k]:g}" for k in changed)
            raise SearchError(f"{where} judged the budget with {was}, not {now}: its measured settings' verdicts "
                              f"hold under that rule; resume it with {was}, or start anew with {start_anew} "
                              f"{prior_hint}")
        # a study made before the protocol was kept: its windows' protocol is unknown, and refusing would strand
        # every such study; this search's is taken for it and recorded, so that the next resume or worker is held
        unrecorded = [k for k in PROTOCOL_FLAGS if k in self.fields and k not in stored]
        diff = sorted(k for k in self.fields.keys() | stored.keys()
                      if k not in unrecorded and stored.get(k) != self.fields.get(k))
        if diff and all(k in PROTOCOL_FLAGS for k in diff):
            was = " ".join(_flag_value(k, stored[k]) for k in diff)
            raise SearchError(f"{where} measured its settings with {_made_with(stored, self.fields, diff)}: its "
                              f"windows and this search's would be compared as one; resume it with {was}, or start "
                              f"anew with {start_anew} {prior_hint}")
        if diff and diff != ["steps_to_target"]:
            raise SearchError(f"{where} was made with {_made_with(stored, self.fields, diff)}; use {start_anew} "
                              f"to start anew {prior_hint}")
        was_law = records.read_target(study)
        law_changed = self.is_law and was_law is not None and not _same_numbers(was_law, self.law)
        if not diff and not law_changed:
            if records.read_rescored(study) and not ranks_measurements(sampler):
                raise SearchError(f"{where} was scored again with other steps to target, and the values Optuna "
                                  f"was told mix both, which sampler {sampler!r} ranks by; resume it with "
                                  f"--sampler guided, or start anew with {start_anew} {prior_hint}")
            if unrecorded:
                self._adopt_protocol(study, unrecorded)
                records.update_identity(study, {**stored, **{k: self.fields[k] for k in unrecorded}})
            return
        if not ranks_measurements(sampler):
            what = ", ".join(diff) if diff else "B_noise"
            raise SearchError(f"{where} was made with a different {what}, and sampler {sampler!r} ranks the values "
                              f"it was told; resume it with --sampler guided (it scores the measurements again), "
                              f"or start anew with {start_anew} {prior_hint}")
        was = stored.get("steps_to_target")
        _log.warning("study %r was scored with %s; its %d measured settings are scored again with %s",
                     study.study_name, _steps_text(was, was_law),
                     records.measured_count(study.get_trials(deepcopy=False)),
                     _steps_text(self.fields.get("steps_to_target"), self.law))
        records.write_rescored(study, was if was is not None else {"law": dict(was_law or {})})
        if unrecorded:
            self._adopt_protocol(study, unrecorded)
        records.write_identity(study, self.fields, target=self.law, **rule)

    def _adopt_protocol(self, study: optuna.Study, unrecorded: Sequence[str]) -> None:
        """Say that ``study``, made before its measurement protocol was kept, takes this search's fields
        ``unrecorded`` for it (the caller records them)."""
        _log.warning("study %r recorded no measurement protocol (made before edgetune kept it): its measurements "
                     "are taken as made with %s, which it records from now on", study.study_name,
                     ", ".join(_flag_value(k, self.fields[k]) for k in unrecorded))
