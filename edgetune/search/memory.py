"""What a batch size that ran out of device memory says of the settings not measured yet.

The memory a training step holds grows with the batch size and does not depend on any knob of the registry
(:attr:`~edgetune.power.knobs.KnobRole.keeps_memory`: the GPU, memory and CPU clocks, the online cores, a power
limit, a power mode, ``jetson_clocks``). So once batch size B ran out of memory at one setting, every batch size
from B up runs out at every setting that differs from it only in such knobs. A knob the registry does not know
(a table's column with no role) may be a sequence length or a precision: it must be equal for the rule to hold.

:func:`known_out_of_memory` finds the measured trial that says so of a setting; the search then tells the trial
FAIL without touching the device (:func:`~edgetune.search.records.write_out_of_memory`: recorded as a duplicate
of that trial, never counted as measured), as it does a setting measured before (:mod:`edgetune.search.fleet`).
It reads the study's measured trials, so every worker of a fleet and a resumed study know what any of them ran
out of memory at. (On the twin, cnn with ``--batch-sizes 16,65536,131072`` measured one trial in six at such a
batch: each an out-of-memory error on the board after its knobs were set.)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from edgetune.power.base import KnobValue
from edgetune.power.knobs import KNOBS, Candidate
from edgetune.search.records import TrialRecord

__all__ = ["OutOfMemory", "known_out_of_memory", "memory_knobs", "ran_out_of_memory"]


def memory_knobs(candidate: Candidate) -> dict[str, KnobValue]:
    """``candidate``'s knobs that may change the memory a step holds: those the registry does not know, and
    those of a role that does not keep it (none so far)."""
    return {name: value for name, value in candidate.setting
            if (spec := KNOBS.get(name)) is None or not spec.role.keeps_memory}


@dataclass(frozen=True)
class OutOfMemory:
    """A measured trial whose batch did not fit in device memory.

    Attributes:
        trial: its number.
        candidate: its batch size and setting.
    """

    trial: int
    candidate: Candidate

    def covers(self, candidate: Candidate) -> bool:
        """``candidate`` runs out of memory too: a batch size at least this one's, every knob that may change
        the memory a step holds (:func:`memory_knobs`) at the same value."""
        return (candidate.batch_size >= self.candidate.batch_size
                and memory_knobs(candidate) == memory_knobs(self.candidate))

    @property
    def reason(self) -> str:
        """Why a setting it covers is not measured, one line (a trial's recorded error)."""
        return (f"out of memory: batch size {self.candidate.batch_size} ran out of memory at trial {self.trial}; "
                f"not measured")


def ran_out_of_memory(records: Iterable[TrialRecord]) -> list[OutOfMemory]:
    """The measured trials among ``records`` that ran out of memory, smallest batch size first, then the
    earliest: the first that covers a setting is the one its reason names."""
    return sorted((OutOfMemory(r.number, r.candidate) for r in records if r.measured and r.oom),
                  key=lambda o: (o.candidate.batch_size, o.trial))


def known_out_of_memory(records: Iterable[TrialRecord], candidate: Candidate) -> OutOfMemory | None:
    """The measured trial among ``records`` whose out of memory ``candidate`` shares (:meth:`OutOfMemory.covers`),
    or None: ``candidate`` is to be measured."""
    return next((o for o in ran_out_of_memory(records) if o.covers(candidate)), None)
