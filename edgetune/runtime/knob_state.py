"""The knob values in force on a tuned run, and the writes that change them.

:class:`KnobState` keeps what the :class:`~edgetune.runtime.controller.Tuner` knows of the device's knobs: the
values found when the run began, the values in force (``tuner.setting``), which knobs the run has written (a
clock it has not written runs as its governor runs it: :func:`~edgetune.runtime.board.governed_setting`) and
which failed to write (left as they are, tried again after a back-off on the device clock: :class:`Refused`). It
writes through
:meth:`~edgetune.power.base.Device.apply` and keeps its records true when a write fails partway
(:class:`~edgetune.power.base.ApplyError`). The controller decides when to write, and records the events.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from edgetune.power.base import MODE_KNOB, ApplyError, Device, DeviceError, Knob, KnobValue, format_value
from edgetune.power.knobs import reads_running_clock
from edgetune.runtime.board import governed_setting

__all__ = ["RETRY_FIRST_S", "RETRY_MAX_S", "RETRY_TRIES", "KnobState", "Refused"]

#: device seconds before a knob whose write failed is tried again: a busy driver (EBUSY while the GPU driver
#: works, a devfreq node mid-transition, EAGAIN) answers again within milliseconds to seconds, and a knob still
#: refused then costs one write (and one event) per back-off, not one per guard move
RETRY_FIRST_S = 30.0
#: the back-off doubles after each failed try, up to this many device seconds
RETRY_MAX_S = 480.0
#: tries after the first failure before the knob is left for the run: 30 + 60 + 120 + 240 + 480 s, 15.5 min
#: of device time refused, is no busy moment but another client holding the knob (jetson_clocks, nvpmodel, a
#: second tuner), which a later try would only disturb
RETRY_TRIES = 5


def error_kind(exc: ApplyError) -> str:
    """A failed write's error with the value tried left out (a retry tries another value: same error)."""
    return str(exc).replace(str(exc.value), "<value>")


@dataclass
class Refused:
    """A knob whose write failed during the run, until a write of it succeeds.

    Attributes:
        error: the last failure's error.
        tries: the tries after the first failure that failed too (0: only the first failure).
        retry_t: device time from which it may be tried again (None: left for the rest of the run).
        warn: whether the last failure is to be warned of: its error (the value tried left out) not seen before.
        seen: the errors seen, the value tried left out (:func:`error_kind`).
        on_trial: taken back after its back-off (:meth:`KnobState.readmit`): the next write of it is its try;
            False: out of every move.
    """

    error: str
    tries: int = 0
    retry_t: float | None = None
    warn: bool = True
    seen: set[str] = field(default_factory=set)
    on_trial: bool = False

    @property
    def final(self) -> bool:
        """True once its last try failed: it is left as it is for the rest of the run."""
        return self.retry_t is None

    def schedule(self, t: float) -> None:
        """Its next try after a failure at device time ``t`` (none after :data:`RETRY_TRIES` tries)."""
        self.retry_t = t + self.wait_s if self.tries < RETRY_TRIES else None

    def failed(self, exc: ApplyError, t: float, first: bool) -> None:
        """A failure at device time ``t`` (``first``: the first, else a try): out, the back-off doubled after a try;
        warned of where its error is one not seen before."""
        if not first:
            self.tries += 1
        kind = error_kind(exc)
        self.on_trial = False
        self.warn = kind not in self.seen
        self.seen.add(kind)
        self.error = str(exc)
        self.schedule(t)

    @property
    def next_try(self) -> str:
        """Its next try, as text (``try 2 of 5``)."""
        return f"try {self.tries + 1} of {RETRY_TRIES}"

    @property
    def wait_s(self) -> float:
        """The back-off after its last failure (device seconds)."""
        return min(RETRY_FIRST_S * 2 ** self.tries, RETRY_MAX_S)


class KnobState:
    """The knobs of one run's device: as found, in force, written, failed.

    Attributes:
        device: the device (None until :meth:`start`).
        original: every knob's value when the run began.
        setting: every knob's value in force (a clock the run has not written: its reading at the start).
        written: the knobs the run has written: their value in force is the one written.
        refused: every knob whose write failed and has not succeeded since, out (:attr:`failed`) or on trial
            (taken back by :meth:`readmit`: the next write of it is its try).
    """

    def __init__(self) -> None:
        self.device: Device | None = None
        self.original: dict[str, KnobValue] = {}
        self.setting: dict[str, KnobValue] = {}
        self.written: set[str] = set()
        self.refused: dict[str, Refused] = {}
        self._back: list[tuple[str, Refused]] = []  # knobs on trial whose write succeeded, for the controller
        self._label: tuple[dict[str, KnobValue], str] | None = None  # the setting label per step, cached

    def start(self, device: Device) -> None:
        """The run begins on ``device``: every knob as found is in force."""
        self.device = device
        self.original = device.settings()
        self.setting = dict(self.original)

    @property
    def failed(self) -> dict[str, str]:
        """The knobs out of every move now, their write having failed, with the error (:attr:`refused` says when
        they are tried again)."""
        return {k: r.error for k, r in self.refused.items() if not r.on_trial}

    @property
    def knobs(self) -> dict[str, Knob]:
        assert self.device is not None, "start() first"
        return self.device.knobs

    def governed(self) -> dict[str, KnobValue]:
        """The setting in force, the clocks the run has not written as their governors run them
        (:func:`~edgetune.runtime.board.governed_setting`)."""
        assert self.device is not None, "start() first"
        return governed_setting(self.device, self.setting, self.written)

    def settable(self) -> dict[str, Knob]:
        """The device's knobs less those whose write failed during the run."""
        return {k: v for k, v in self.knobs.items() if k not in self.failed}

    def changes_for(self, setting: Mapping[str, KnobValue]) -> tuple[dict[str, KnobValue], list[str], list[str]]:
        """What writing ``setting`` changes (its values checked against the knobs' tables), and the knobs of
        ``setting`` left out: not settable here (unknown, read-only), and failed during the run."""
        settable = self.settable()
        writable = {k: self.knobs[k].validate(v) for k, v in setting.items() if k in settable and settable[k].writable}
        failed = sorted(k for k in setting if k in self.failed)
        skipped = sorted(set(setting) - set(writable) - set(failed))
        # a clock the run has not set reads the frequency running now: equal to the value asked for, it may
        # still be the governor's, so it is written (locked) all the same
        changes = {k: v for k, v in writable.items()
                   if self.setting.get(k) != v or (k not in self.written and reads_running_clock(k))}
        return changes, skipped, failed

    def rung_changes(self, rung: Mapping[str, KnobValue]) -> dict[str, KnobValue]:
        """The knobs a guard rung changes, those the run can set."""
        settable = self.settable()
        return {k: v for k, v in rung.items() if self.setting.get(k) != v and k in settable and settable[k].writable}

    def write(self, changes: Mapping[str, KnobValue]) -> None:
        """Write ``changes`` (:meth:`~edgetune.power.base.Device.apply`) and record them in force; an
        :class:`~edgetune.power.base.ApplyError` is raised as it is (:meth:`fail` records it)."""
        if not changes:
            return
        assert self.device is not None, "start() first"
        self.device.apply(changes)
        self.setting.update(changes)
        self.written.update(changes)
        self._mode_reset(changes)
        self._succeeded(changes)

    def _succeeded(self, written: Mapping[str, KnobValue]) -> None:
        """Knobs on trial among those ``written`` are back: no longer refused."""
        for name in written:
            if name in self.refused and self.refused[name].on_trial:
                self._back.append((name, self.refused.pop(name)))

    def take_back(self) -> list[tuple[str, Refused]]:
        """The knobs on trial written since the last call (back in every move), for the controller's event."""
        back, self._back = self._back, []
        return back

    def due(self, t: float) -> list[str]:
        """The knobs out whose back-off has passed at device time ``t``."""
        return [k for k, r in self.refused.items() if not r.on_trial and r.retry_t is not None and r.retry_t <= t]

    def readmit(self, names: list[str]) -> None:
        """Take ``names`` back on trial: settable again, the next write of each is its try (:meth:`fail` puts it
        out again with the back-off doubled; a success is :meth:`take_back`'s)."""
        for name in names:
            if name in self.refused:
                self.refused[name].on_trial = True

    def _mode_reset(self, written: Mapping[str, KnobValue]) -> None:
        """A power mode among the knobs ``written`` resets the knobs under it (``nvpmodel -m`` writes every clock's
        range and the online cores; the twin does the same): each knob the write left alone is read back and
        counts as not written from then on (a clock then runs as its governor runs it under the new mode:
        :meth:`governed`). One whose read fails keeps its value, not written: its governed value stands for it."""
        if MODE_KNOB not in written:
            return
        for name, knob in self.knobs.items():
            if name in written:
                continue
            try:
                self.setting[name] = knob.read()
            except (DeviceError, OSError, ValueError):
                pass
            self.written.discard(name)

    def fail(self, exc: ApplyError, t: float) -> KnobValue:
        """A write failed at device time ``t``: the knobs written before it are in force (``exc.applied``), and the
        failed knob at its value in force: as found where its platform put it back
        (:attr:`~edgetune.power.base.Knob.original` None again), else the value before the write. It is out of
        every move until its back-off has passed (:class:`Refused`: doubled on each failure; after
        :data:`RETRY_TRIES` tries, for the rest of the run). Returns that value, a clock not written as its
        governor runs it."""
        name, knob = exc.knob, self.knobs[exc.knob]
        self.setting.update(exc.applied)
        self.written.update(exc.applied)
        self._mode_reset(exc.applied)
        self._succeeded(exc.applied)  # the failed knob too: a mode written before it reset it
        if knob.original is None:  # its platform put it back as found (its error says so): governed, if a clock
            self.setting[name] = self.original[name]
            self.written.discard(name)
        refused = self.refused.get(name)
        if refused is None:
            self.refused[name] = refused = Refused(str(exc))
        refused.failed(exc, t, first=not refused.seen)
        return self.governed()[name]

    def stays(self, exc: ApplyError) -> str:
        """For the warning on a failed write (:meth:`fail`): the value the knob keeps, where its error does not
        say it (a refused write leaves the value before it; a platform that put the knob back as found says so)."""
        name, knob = exc.knob, self.knobs[exc.knob]
        return "" if knob.original is None else f"{name} stays at {format_value(self.setting[name], knob.unit)}; "

    def written_text(self, changes: Mapping[str, KnobValue], failure: ApplyError | None) -> str:
        """The knobs a move wrote, as text (with the one whose write failed, if one did)."""
        knobs = self.knobs
        written = changes if failure is None else failure.applied
        text = ", ".join(f"{k}={format_value(v, knobs[k].unit)}" for k, v in written.items())
        if failure is None:
            return text
        failed = f"{failure.knob} not set (its write failed)"
        return f"{text}; {failed}" if text else failed

    def label(self) -> str:
        """The setting in force as text (per step in the accounting; formatted again only when it changed)."""
        if self._label is not None and self._label[0] == self.setting:
            return self._label[1]
        text = " ".join(f"{k}={v}" for k, v in self.formatted().items())
        self._label = (dict(self.setting), text)
        return text

    def formatted(self) -> dict[str, str]:
        """The writable knobs' values in force, formatted in their units (the summary's ``setting``)."""
        knobs = self.knobs
        return {k: format_value(v, knobs[k].unit) for k, v in self.setting.items() if k in knobs and knobs[k].writable}

    def as_found(self, device: Device) -> bool:
        """Whether every knob of ``device`` reads its value as found (after a restore; true where the run ended
        before it began). A clock reads the running frequency, which a governor moves: its restore is the
        write's success, not compared."""
        now = device.settings()
        return all(now.get(k) == v for k, v in self.original.items() if not reads_running_clock(k))
