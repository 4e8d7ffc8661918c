"""The training processes on this machine (``torchrun``, DDP) and what each one's tuner may do.

Several processes that train one model on one machine each open a tuner (``tune()`` in every process, or an
adapter's callback). What a tuner may do depends on what its device measures and sets
(:func:`machine_share`):

* the GPU its model trains on (``device="nvml"``, or ``auto`` picking an NVIDIA GPU:
  :func:`~edgetune.runtime.board.device_spec`): every process tunes its own GPU, each held to the budget;
* a sensor of the whole machine (:attr:`~edgetune.power.base.Capability.WHOLE_MACHINE`: a Jetson's rails,
  jtop, RAPL): one tuner per board, local rank 0's. Its steps count every process's samples (each trains the
  same batch, as DDP does). A tuner in another local rank is refused before it sets a knob: it would set the
  board's clocks under local rank 0's tuner;
* anything else (a GPU named by number, the twin, a trace): each process tunes what it opens, and local
  rank 0 warns that the other processes' devices are not held to the budget by its tuner.

Local rank 0 alone records the run in ``runs_file``; another rank's ``log=`` file gets its rank in its name
(``steps.csv`` -> ``steps.rank1.csv``), so that no process refuses another's file as existing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from edgetune.power.base import Capability, Device

__all__ = ["LOCAL_RANK_ENV", "LOCAL_WORLD_SIZE_ENV", "LocalProcesses", "MachineShare", "machine_share"]

#: this process's index among the training processes on this machine (torchrun, accelerate, Lightning)
LOCAL_RANK_ENV = "LOCAL_RANK"
#: the number of training processes on this machine (torchrun, accelerate)
LOCAL_WORLD_SIZE_ENV = "LOCAL_WORLD_SIZE"


@dataclass(frozen=True)
class LocalProcesses:
    """The training processes on this machine and this one's place among them.

    Attributes:
        count: how many processes train on this machine (1: this one alone).
        rank: this process's local rank, 0 to ``count - 1``; local rank 0 records the run.
    """

    count: int = 1
    rank: int = 0

    def __post_init__(self) -> None:
        for name in ("count", "rank"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"LocalProcesses.{name} must be a whole number, got {value!r}")
        if self.count < 1 or not 0 <= self.rank < self.count:
            raise ValueError(f"local rank {self.rank} of {self.count} processes: the rank must be 0 to "
                             f"{self.count - 1} and there must be at least one process")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> LocalProcesses:
        """Read them where ``torchrun`` (and ``accelerate launch``) put them: ``LOCAL_WORLD_SIZE`` and
        ``LOCAL_RANK``. Neither set: one process. A rank without a count (an older launcher) counts the
        processes up to it."""
        env = os.environ if environ is None else environ
        values: dict[str, int] = {}
        for key in (LOCAL_RANK_ENV, LOCAL_WORLD_SIZE_ENV):
            text = env.get(key, "").strip()
            if not text:
                continue
            try:
                values[key] = int(text)
            except ValueError:
                raise ValueError(f"{key}={text!r} is not a whole number: the launcher (torchrun) sets it; unset "
                                 f"it, or pass processes=LocalProcesses(count, rank) to tune()") from None
        rank = values.get(LOCAL_RANK_ENV, 0)
        count = values.get(LOCAL_WORLD_SIZE_ENV, rank + 1)
        try:
            return cls(count, rank)
        except ValueError as exc:
            raise ValueError(f"{LOCAL_WORLD_SIZE_ENV}={count} and {LOCAL_RANK_ENV}={rank}: {exc}") from None

    @property
    def shared(self) -> bool:
        """Whether other training processes run on this machine."""
        return self.count > 1

    def own_path(self, path: str | os.PathLike | None) -> str | os.PathLike | None:
        """This process's copy of a per-run file: local rank 0 keeps ``path``; rank ``k`` writes
        ``<stem>.rank<k><suffix>`` beside it."""
        if path is None or self.rank == 0:
            return path
        p = Path(path)
        return p.with_name(f"{p.stem}.rank{self.rank}{p.suffix}")


@dataclass(frozen=True)
class MachineShare:
    """What one tuner does among several training processes (:func:`machine_share`).

    Attributes:
        samples_factor: each step's samples are this process's times this: the processes whose steps the
            device's power measures (a whole-machine sensor: all of them; else 1).
        event: the line for the run's events (None: nothing to say).
        warning: a line to warn with (the other processes' devices not held to the budget), or None.
        refusal: why this tuner may not run here (another local rank tunes the board), or None.
    """

    samples_factor: int = 1
    event: str | None = None
    warning: str | None = None
    refusal: str | None = None


def machine_share(processes: LocalProcesses, device: Device, budget_w: float, *, own_gpu: bool) -> MachineShare:
    """What a tuner on ``device`` does as local rank ``processes.rank`` of ``processes.count`` (module
    docstring). ``own_gpu``: the device is the GPU this process's model trains on, by the spec's choice."""
    n = processes.count
    if not processes.shared:
        return MachineShare()
    if own_gpu:
        return MachineShare(event=f"{n} training processes on this machine: each tunes and measures the GPU it "
                                  f"trains on under the {budget_w:g}-W budget (this one: {device.name})")
    if device.has(Capability.WHOLE_MACHINE):
        if processes.rank:
            return MachineShare(refusal=(
                f"tune() in local rank {processes.rank} of {n}: {device.name} is one board, whose sensor measures "
                f"every process and whose knobs local rank 0 tunes; open the tuner in local rank 0 only (in the "
                f"others, train without it: `contextlib.nullcontext()`), or use edgetune's Lightning or Hugging "
                f"Face callback, which does that itself"))
        return MachineShare(samples_factor=n, event=(
            f"{n} training processes share this machine: this one (local rank 0) tunes the board; its power is "
            f"theirs, so each step counts {n} times this process's samples (each trains the same batch, as DDP "
            f"does)"))
    if processes.rank:
        return MachineShare()  # rank 0 says it once for the machine
    return MachineShare(warning=(
        f"{n} training processes on this machine: this one (local rank 0) tunes and measures {device.name} alone; "
        f"the other processes' devices are not held to the {budget_w:g}-W budget by this tuner, and the energy "
        f"per sample is {device.name}'s over this process's samples (with device='nvml' each process tunes the "
        f"GPU it trains on)"))
