"""One tuner per run: the ``with tune(...)`` blocks running now, and the refusals that keep them apart.

A block inside another on the same optimizer or the same real board would count every step twice, and its
restore would put the knobs back under the outer block; a tuner whose block has ended has a finished run and
summary that a late call must not change. :class:`~edgetune.runtime.controller.Tuner` asks here.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Protocol

from edgetune.power.base import Device

if TYPE_CHECKING:
    import torch

__all__ = ["refuse_after_block", "refuse_nested", "started", "stopped"]


class _Run(Protocol):
    """What the rule reads of a running tuner."""

    optimizer: torch.optim.Optimizer | None
    device: Device


#: the tuners whose ``with`` block runs now
_RUNNING: weakref.WeakSet[Any] = weakref.WeakSet()


def started(run: _Run) -> None:
    """``run``'s block runs from now on."""
    _RUNNING.add(run)


def stopped(run: _Run) -> None:
    """``run``'s block has ended (or never started)."""
    _RUNNING.discard(run)


def refuse_nested(optimizer: torch.optim.Optimizer | None, device: str | Device) -> None:
    """A block on ``optimizer`` and ``device`` (the device spec before it is opened) is refused where one runs
    on the same optimizer or the same board: both would count every step, and the inner block's restore would
    put the knobs back under the outer one. The twin is no board: two twins of one profile are two boards."""
    for other in list(_RUNNING):
        same_optimizer = optimizer is not None and other.optimizer is optimizer
        same_board = device is other.device or (isinstance(device, Device) and not device.simulated
                                                and device.name == other.device.name)
        if same_optimizer or same_board:
            what = "optimizer" if same_optimizer else f"board ({other.device.name})"
            raise RuntimeError(f"a tune() block already runs on this {what}: one tuner per run; use the "
                               f"outer block's tuner, or end that block first")


def refuse_after_block(ended: bool, what: str, fix: str = "call it inside the block") -> None:
    """``tuner.<what>`` once the ``with`` block ended (``ended``): one line, where it would change a finished run."""
    if ended:
        raise RuntimeError(f"tuner.{what} after the with block: the run and its summary have ended; {fix}")
