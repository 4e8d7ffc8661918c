"""The Jetson's power modes: ``nvpmodel``, its configuration, and which modes switch without a reboot.

``/etc/nvpmodel.conf`` lists the modes, one ``< POWER_MODEL ID=n NAME=... >`` block each, with the caps the
mode sets on every clock, the CPU cores it keeps online and the GPU TPCs it power-gates (``TPC_POWER_GATING
TPC_PG_MASK m``). :func:`mode_caps` reads what each mode caps; :func:`power_mode_knob` is the ``power_mode``
knob, which runs ``nvpmodel -m <id>`` and reads the mode back.

Modes that need a reboot
    A GPU TPC power-gating mask is set at boot: ``nvpmodel -m`` to a mode whose ``TPC_PG_MASK`` differs from
    the GPU's live mask (``<gpu>/device/tpc_pg_mask``) does not switch; it prints ``NVPM WARN: Reboot required
    for changing to this power mode`` and asks ``DO YOU WANT TO REBOOT NOW? enter YES/yes to confirm``, and
    without that answer ends with ``NVPM ERROR: optMask is 1, no request for power mode``, the mode unchanged.
    On an Orin Nano 8GB booted in 15W (mask 240), 7W (mask 252) is such a mode; on an AGX Orin in MODE_30W
    (240), every other mode is; on an Orin NX, 10W and 15W (252) switch between each other live, as do MAXN
    and 25W (20W on the 8GB; 240); every Xavier NX mode shares one mask. jetson-stats' jtop service offers the
    same-mask modes only, by the same rule. So the knob offers the modes whose mask is the live one (and the
    mode in force), and lists the others in :attr:`~edgetune.power.base.Knob.unavailable` with the way to
    reach one: ``sudo nvpmodel -m <id>``, confirm, reboot, and run edgetune there. A search then
    covers the power modes the board can run without a reboot, and a plan asking for another is refused in
    one line. Should ``nvpmodel`` ask for a reboot all the same, the write raises
    :class:`~edgetune.power.base.KnobWriteError` saying so, whatever its exit status (stdin is closed, so
    it never waits for the answer), and every write is checked by reading the mode back.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edgetune.power.base import DeviceError, Knob, KnobValue, KnobWriteError, ModeCaps, largest_at_most
from edgetune.power.knobs import knob_unit
from edgetune.power.state import RestorableKnob, StateTracker
from edgetune.power.sysfs import ROOT_FIX, first_existing, is_root, knob_read_error, read_knob_text, read_text

__all__ = ["PG_MASK", "mode_caps", "pg_masks", "power_mode_knob"]

#: How long nvpmodel may take: a mode change reprograms clocks and cores, normally within seconds.
_NVPMODEL_TIMEOUT_S = 30
#: Characters of unreadable nvpmodel output shown in an error.
_SHOWN_CHARS = 60
#: The key of a mode's GPU TPC power-gating mask in its POWER_MODEL block (and in :attr:`ModeCaps.fixed`).
PG_MASK = "TPC_PG_MASK"
#: What nvpmodel prints where a mode needs a reboot.
_REBOOT_REQUIRED = "reboot required"
#: The fix for an nvpmodel.conf that is gone or cannot be read: L4T's package installs it (a link to the
#: module's own conf).
CONF_FIX = "reinstall L4T's nvpmodel (`sudo apt install --reinstall nvidia-l4t-nvpmodel`)"
#: The fix for nvpmodel's status file that cannot be read: nvpmodel writes it at every mode change.
STATUS_FIX = "nvpmodel keeps the board's mode there; check it with `sudo nvpmodel -q`"

_MODE_LINE = re.compile(r"<\s*POWER_MODEL\s+ID=(\d+)\s+NAME=([^\s>]+)")
_DEFAULT_MODE_LINE = re.compile(r"<\s*PM_CONFIG\s+DEFAULT=(\d+)")

#: a POWER_MODEL block's frequency keys and the knob each caps (CPU clusters: CPU_A78_0, CPU_DENVER_1 ...)
_CAPPED = {"GPU": "gpu_freq", "EMC": "emc_freq", "CPU": "cpu_freq"}


def _mode_blocks(conf_text: str) -> dict[str, list[list[str]]]:
    """Each POWER_MODEL block's lines, split into words, by mode name (comments and other sections skipped)."""
    blocks: dict[str, list[list[str]]] = {}
    current: list[list[str]] | None = None
    for raw in conf_text.splitlines():
        line = raw.strip()
        if line.startswith("<"):
            header = _MODE_LINE.match(line)
            current = blocks.setdefault(header.group(2), []) if header else None
        elif current is not None and line and not line.startswith("#"):
            current.append(line.split())
    return blocks


def _parse_mask(text: str) -> int | None:
    try:
        return int(text.strip(), 0)
    except ValueError:
        return None


def pg_masks(conf_text: str) -> dict[str, int]:
    """Each mode's GPU TPC power-gating mask (``TPC_PG_MASK``), by mode name; a mode that states none is
    left out."""
    masks = {}
    for name, lines in _mode_blocks(conf_text).items():
        for words in lines:
            if len(words) == 3 and words[1] == PG_MASK and _parse_mask(words[2]) is not None:
                masks[name] = _parse_mask(words[2])
    return masks


def mode_caps(conf_text: str, knobs: Mapping[str, Knob]) -> dict[str, ModeCaps]:
    """What each nvpmodel mode does to the other knobs, read from ``nvpmodel.conf``'s POWER_MODEL blocks.

    Per mode: each clock's ``MAX_FREQ`` (Hz for GPU and EMC, kHz for CPU clusters; -1, or 0 for EMC, is no
    cap) and the count of ``CPU_ONLINE CORE_i 1`` lines, each as the largest value of that knob's table at
    or below it; the power-gating masks (``TPC_PG_MASK`` ...), a ``MIN_FREQ`` above a knob's lowest value and
    per-cluster CPU caps that differ go into :attr:`ModeCaps.fixed`, so that such modes are never taken for
    another. Lines outside a POWER_MODEL block (the PARAM definitions, with their own ``MAX_FREQ`` paths)
    are not read; a knob the board lacks is not capped. A mode whose block states no limit for a knob the
    board has (no ``MAX_FREQ`` line, no ``CPU_ONLINE`` lines) is left out: what it caps is unknown, and a
    search then treats its settings as its own.
    """
    caps: dict[str, ModeCaps] = {}
    for name, lines in _mode_blocks(conf_text).items():
        highest: dict[str, list[float]] = {}
        fixed: dict[str, Any] = {}
        online = None
        for words in lines:
            if len(words) != 3:
                continue
            unit, key, value = words
            try:
                number = float(value)
            except ValueError:
                continue
            if unit == "CPU_ONLINE":
                online = (online or 0) + (number == 1)
            elif key.endswith("_PG_MASK"):
                fixed[key] = value
            elif key in ("MAX_FREQ", "MIN_FREQ") and unit.split("_")[0] in _CAPPED:
                knob = _CAPPED[unit.split("_")[0]]
                if knob not in knobs:
                    continue
                if key == "MAX_FREQ":
                    highest.setdefault(knob, []).append(number if number > 0 else float(knobs[knob].max))
                elif number > float(knobs[knob].min):
                    fixed[f"{unit}_MIN_FREQ"] = value
        max_values: dict[str, KnobValue] = {}
        for knob, limits in highest.items():
            if len(set(limits)) > 1:
                fixed[f"{knob}_caps"] = tuple(limits)
            max_values[knob] = largest_at_most(knobs[knob].values, max(limits))
        if online is not None and "cpu_cores" in knobs:
            max_values["cpu_cores"] = largest_at_most(knobs["cpu_cores"].values, online)
        if any(k in knobs and k not in max_values for k in (*_CAPPED.values(), "cpu_cores")):
            continue  # a block silent on a knob the board has: its cap is unknown, not absent
        caps[name] = ModeCaps(tuple(sorted(max_values.items())), tuple(sorted(fixed.items())))
    return caps


def _live_mask(gpu_devfreq: Path | None, masks: Mapping[str, int], current: str) -> int | None:
    """The GPU's power-gating mask now: its ``device/tpc_pg_mask`` file, else the mode in force's."""
    if gpu_devfreq is not None:
        try:
            live = _parse_mask(read_text(gpu_devfreq / "device/tpc_pg_mask"))
        except OSError:
            live = None
        if live is not None:
            return live
    return masks.get(current)


def power_mode_knob(root: Path, tracker: StateTracker, others: Mapping[str, Knob] | None = None,
                    gpu_devfreq: Path | None = None) -> tuple[RestorableKnob | None, list[str]]:
    """The nvpmodel mode, with the board's other knobs what each mode caps of them (:func:`mode_caps`), and
    notes on the modes held back (module docs: another GPU power-gating mask needs a reboot). No knob (None) with
    one note: why the board's power mode cannot be tuned (``nvpmodel.conf`` gone or listing no mode, half of
    nvpmodel) and the fix; no knob and no note: no nvpmodel at all.

    ``gpu_devfreq``: the GPU's devfreq directory, beside whose device the live mask is read.
    """
    conf = first_existing(root / p for p in ("etc/nvpmodel.conf", "etc/nvpmodel/nvpmodel.conf"))
    binary = first_existing(root / p for p in ("usr/sbin/nvpmodel", "usr/bin/nvpmodel"))
    if conf is None and binary is None:  # no nvpmodel on this board or tree
        return None, []
    if conf is None or binary is None:  # half of it: said, not passed over
        found, lacking = (binary, "/etc/nvpmodel.conf") if conf is None else (conf, "nvpmodel command")
        return None, [f"power_mode not tunable: {found} found but no {lacking}; {CONF_FIX}"]
    conf_text = read_knob_text(conf, "power_mode", CONF_FIX)  # a directory, EACCES, EIO: one line
    modes = {int(i): name for i, name in _MODE_LINE.findall(conf_text)}
    if not modes:
        blockless = f"power_mode not tunable: {conf} has no < POWER_MODEL ID=n NAME=... > block; {CONF_FIX}"
        return None, [blockless]
    by_name = {name: i for i, name in modes.items()}
    default = _DEFAULT_MODE_LINE.search(conf_text)  # the mode L4T boots into
    default_id = int(default.group(1)) if default and int(default.group(1)) in modes else None
    status = root / "var/lib/nvpmodel/status"

    def run(*args: str) -> str:
        try:
            done = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=_NVPMODEL_TIMEOUT_S,
                                  stdin=subprocess.DEVNULL, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise KnobWriteError(f"power_mode: running {binary} failed: {exc}") from None
        said = f"{done.stdout}\n{done.stderr}"
        if args[:1] == ("-m",) and _REBOOT_REQUIRED in said.lower():
            mode_id = int(args[1])
            raise KnobWriteError(f"power_mode: {modes.get(mode_id, mode_id)} needs a reboot (nvpmodel: another GPU "
                                 f"power-gating mask); the mode is unchanged; {_reboot_fix(mode_id)}")
        if done.returncode != 0:
            why = (done.stderr or done.stdout).strip().splitlines()
            raise KnobWriteError(f"power_mode: nvpmodel {' '.join(args)} failed: {why[-1] if why else done.returncode}")
        return done.stdout

    def current_id() -> int:
        try:  # what nvpmodel itself keeps: "pmode:0002 fmode:..."; gone or without a mode: nvpmodel -q
            m = re.search(r"pmode:(\d+)", read_text(status))
        except FileNotFoundError:
            m = None
        except OSError as exc:  # a directory, EACCES, EIO: one line naming it, not a traceback
            raise knob_read_error(status, "power_mode", exc, STATUS_FIX) from None
        if m:
            return int(m.group(1))
        out = run("-q")
        numbers = [int(x) for x in re.findall(r"^\s*(\d+)\s*$", out, re.MULTILINE)]
        if numbers:
            return numbers[-1]
        m = re.search(r"NV Power Mode:\s*(\S+)", out)
        if m and m.group(1) in by_name:
            return by_name[m.group(1)]
        raise KnobWriteError(f"power_mode: cannot read the current mode from nvpmodel -q: "
                             f"{out.strip()[:_SHOWN_CHARS]!r}")

    def switch(mode_id: int) -> None:
        run("-m", str(mode_id))
        now = current_id()
        if now != mode_id:  # nvpmodel said nothing wrong, yet the board is elsewhere
            raise KnobWriteError(f"power_mode: nvpmodel -m {mode_id} left the board in "
                                 f"{modes.get(now, now)}, not {modes[mode_id]}")

    def read() -> str:
        return modes.get(current_id(), str(current_id()))

    def write(value: str) -> None:
        switch(by_name[str(value)])

    def snapshot() -> dict[str, Any]:
        return {"mode_id": current_id()}

    def restore(snap: dict[str, Any]) -> None:
        mode = int(snap["mode_id"])
        if mode not in modes:
            raise ValueError(f"power_mode: saved mode id {mode} is not in {conf}")
        switch(mode)

    masks = pg_masks(conf_text)
    try:
        current: str | None = read()
    except DeviceError:  # nvpmodel -q or its status unreadable: the live mask decides (reading raises later)
        current = None
    live = _live_mask(gpu_devfreq, masks, current or "")
    offered = [modes[i] for i in sorted(modes)
               if modes[i] == current or live is None or masks.get(modes[i], live) == live]
    held = {name: (f"needs a reboot: its GPU power-gating mask ({PG_MASK} {masks[name]}) is not the one the "
                   f"board booted with ({live}); {_reboot_fix(by_name[name])}")
            for name in (modes[i] for i in sorted(modes)) if name not in offered}
    them = "it" if len(held) == 1 else "them"
    note = (f"power_mode {', '.join(held)} not offered: switching to {them} needs a reboot (another GPU "
            f"power-gating mask than the board booted with); `sudo nvpmodel -m <id>`, confirm and reboot to "
            f"search there")
    notes = [note] if held else []
    ok = is_root() and os.access(binary, os.X_OK)
    why = "" if ok else (f"nvpmodel needs root; {ROOT_FIX}" if not is_root() else f"{binary} is not executable")
    knob = RestorableKnob("power_mode", knob_unit("power_mode"), offered, read=read, write=write,
                          writable=ok, why_read_only=why, snapshot=snapshot, restore_snapshot=restore,
                          tracker=tracker, description="nvpmodel power mode (sets clock caps and cores)",
                          default_snapshot=None if default_id is None else lambda: {"mode_id": default_id},
                          caps=mode_caps(conf_text, others or {}), unavailable=held)
    return knob, notes


def _reboot_fix(mode_id: int) -> str:
    return f"to use it, run `sudo nvpmodel -m {mode_id}`, answer YES to reboot, and run edgetune again there"
