"""Transfer between boards: an earlier study as prior knowledge for a new search (``--prior``).

A search may start from a study of another board (a sibling module, Orin Nano -> Orin NX), of the same
module in another power mode, or of the same workload at another budget. What it measured there is physics
(step time and power of settings), not a verdict on the new budget, so it is used in three steps:

1. :func:`load_prior` reads the earlier study: a storage URL (``sqlite:///...``, ``journal:<file>``, any
   SQLAlchemy URL) with ``#<study name>`` when it holds several studies, or an output folder holding
   ``study.db``. Its measured settings come back as :class:`~edgetune.search.records.Observation`.
2. :func:`map_to_space` moves them into the new device's space: each knob value snapped to the nearest
   allowed value (numbers by ratio; power modes by name, else by the watts in their names), a knob the new
   space lacks dropped, a knob the prior lacks taken as the new device was found.
3. The guided sampler fits the hardware model on the prior once (:class:`PriorModel`, one model per power
   mode as in a cold search) and learns the *discrepancy* of the new board from its own measurements
   (:class:`Transfer`): a log-space correction of time and power, a constant from the first measurement and a
   Gaussian process over the setting from :data:`MIN_GP_ROWS` on, whose uncertainty (large before anything
   is measured) adds to the prior model's. The prior shapes where to look; it never counts as a
   measurement: only settings measured on the new board are candidates for the result, and only they
   certify the budget.
"""

from __future__ import annotations

import dataclasses
import math
import re
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgetune.log import get_logger
from edgetune.power.base import KnobValue
from edgetune.power.knobs import Candidate
from edgetune.search.records import Observation, read_identity, read_observation
from edgetune.search.space import SearchSpace
from edgetune.search.storage import (
    SearchError,
    check_sqlite_file,
    close_storage,
    open_storage,
    redact,
    sqlite_file,
    storage_file,
)

__all__ = ["CORRECTION_MIN_LENGTH", "MIN_GP_ROWS", "PriorError", "PriorModel", "PriorStudy", "Transfer", "load_prior",
           "map_to_space", "per_setting", "snap"]

_log = get_logger(__name__)

STUDY_DB = "study.db"  # the search's SQLite file in an output folder (edgetune.config.STUDY_DB)
_OPTUNA_TABLE = "studies"  # the table every Optuna RDB storage holds its studies in
BEST_JSON = "best.json"  # the search's result in an output folder: its "study" names the storage and study
NAME_SEP = "#"  # separates a storage URL from the study name: sqlite:///out/study.db#orin-nano-cnn-10W-time
#: log-space std of the new board's correction before any of its measurements: a sibling module or another
#: power mode differs by tens of percent in time and power (Orin Nano vs NX at equal clocks: ~40% in power)
UNKNOWN_DISCREPANCY = 0.5
#: log-space spread of the correction between settings, assumed until three measurements can estimate it:
#: what per-setting differences a constant scale misses (different core counts, memory bandwidth), ~10%
DISCREPANCY_SPREAD = 0.1
MIN_SPREAD = 0.01  # floor of an estimated spread: two agreeing measurements do not make the prior exact (1%)
#: new-board measurements before the correction varies over the setting (a GP); below: a constant
MIN_GP_ROWS = 3
#: shortest length scale of the correction's GP, in units of each feature's log span over the new space: the
#: correction of a physics-based prior varies slowly over the settings. Fitted freely on a handful of a
#: sibling's rows (0.2 allowed), it took each residual for a local one and learned nothing for the measured
#: settings' neighbours: warm searches capped at 15 settings, experiments/transfer.py, worst non-law gap 8.65%
#: at 0.2 against 2.08% at 0.6 (orin-nano 10W -> orin-nx 10W cnn); the cold time benchmark, whose sparse power
#: modes borrow through the same correction, 31 of 36 within 3% at both, mean gap 1.59% -> 1.30% (three-seed truth)
CORRECTION_MIN_LENGTH = 0.6
_MIN_LOG_SPAN = math.log(2.0)  # a knob's feature scale spans at least a factor of two (no division by ~0)
_MODE_WATTS = re.compile(r"(\d+(?:\.\d+)?)\s*W", re.IGNORECASE)  # "7W", "MODE_30W": a mode's budget
_UNBOUNDED_MODE_W = 1e6  # a mode without a number in its name (MAXN): above every numbered mode, W
_GP_SEED = 0  # the correction's GP optimiser: the same fit for the same rows


class PriorError(ValueError):
    """A ``--prior`` that cannot be read: one line naming the problem and the fix."""


@dataclass(frozen=True)
class PriorStudy:
    """An earlier study's measurements, as measured on its own device."""

    source: str  # the storage URL, password redacted
    study_name: str
    identity: Mapping[str, Any]  # device, workload, budget, objective, space (records.write_identity)
    observations: tuple[Observation, ...]  # measured settings that ran

    @property
    def device(self) -> str:
        return str(self.identity.get("device", "?"))

    def describe(self) -> str:
        return (f"prior: {len(self.observations)} settings of study {self.study_name!r} "
                f"({self.device}, {self.identity.get('workload', '?')}, budget {self.identity.get('budget_w')} W)")


# ---------------------------------------------------------------------------------------------- loading


def per_setting(observations: Iterable[Observation]) -> tuple[Observation, ...]:
    """One observation per setting, in order of first measurement: a setting measured again (the pick's
    contenders, :mod:`edgetune.search.confirm`) by the means of its windows (peak: the highest; it held the
    budget when every window did)."""
    by_setting: dict[Candidate, list[Observation]] = {}
    for o in observations:
        by_setting.setdefault(o.candidate, []).append(o)
    out = []
    for windows in by_setting.values():
        if len(windows) == 1:
            out.append(windows[0])
            continue
        out.append(dataclasses.replace(
            windows[0], step_time_s=float(np.mean([o.step_time_s for o in windows])),
            max_avg_power_w=float(np.mean([o.max_avg_power_w for o in windows])),
            power_se_w=float(np.mean([o.power_se_w for o in windows])),
            peak_power_w=max(o.peak_power_w for o in windows), feasible=all(o.feasible for o in windows)))
    return tuple(out)


def _storage_url(spec: str) -> tuple[str, str | None]:
    """(storage URL, study name or None) of a ``--prior`` value."""
    url, _, name = spec.partition(NAME_SEP)
    name = name.strip() or None
    if "://" in url or url.startswith("journal:"):
        file = None
        if url.startswith("sqlite:///") and not url.endswith(":memory:"):
            file = Path(url[len("sqlite:///"):])  # SQLAlchemy would create an empty database
        elif url.startswith("journal:"):
            file = Path(url[len("journal:"):].removeprefix("//"))  # and Optuna an empty journal
        if file is not None and not file.is_file():
            raise PriorError(f"--prior {spec}: no such file {file}; give the output folder of an earlier search, "
                             f"its {STUDY_DB} or its journal file")
        return url, name
    path = Path(url)
    if path.is_dir():
        if not (path / STUDY_DB).is_file() and (path / BEST_JSON).is_file():
            return _storage_of_folder(spec, path, name)
        path = path / STUDY_DB
    if not path.is_file():
        raise PriorError(f"--prior {spec}: no {STUDY_DB} there; give the output folder of an earlier search, "
                         f"or a storage URL (sqlite:///..., journal:FILE)")
    return f"sqlite:///{path.resolve()}", name


def _storage_of_folder(spec: str, folder: Path, name: str | None) -> tuple[str, str | None]:
    """(storage URL, study name) of an output folder without a study.db: a search given ``--storage`` (a fleet's
    journal file or server) keeps its study there, and the folder's best.json names it (``study``: ``storage``,
    ``name``). A relative file path is taken from the directory the search ran in: best.json keeps the file's
    absolute path too (``storage_file``). A server URL whose password best.json left out, or a file found
    neither way (moved, or a best.json written before ``storage_file`` was kept), is refused naming the URL to
    give."""
    import json

    try:
        study = json.loads((folder / BEST_JSON).read_text()).get("study") or {}
        url, held, absolute = study.get("storage"), study.get("name"), study.get("storage_file")
    except (OSError, ValueError, AttributeError):
        url = held = absolute = None
    if not isinstance(url, str) or not isinstance(held, str):
        raise PriorError(f"--prior {spec}: no {STUDY_DB} there, and its {BEST_JSON} names no study edgetune can "
                         f"read; give the earlier search's storage URL (sqlite:///..., journal:FILE) with "
                         f"{NAME_SEP}STUDY_NAME")
    name = name or held
    if redact(url) != url or ":***@" in url:  # best.json keeps a server's URL without its password
        raise PriorError(f"--prior {spec}: its study {held!r} is in {url}, whose password {BEST_JSON} leaves out; "
                         f"give the URL with it: --prior 'URL{NAME_SEP}{name}'")
    file = storage_file(url)
    scheme = "journal:" if url.startswith("journal:") else "sqlite:///"
    if file is not None and not file.is_file() and isinstance(absolute, str) and Path(absolute).is_file():
        # a relative path, taken from where the search ran: the file's absolute path, as best.json keeps it
        url, file = f"{scheme}{absolute}", Path(absolute)
    if file is not None and not file.is_file():
        raise PriorError(f"--prior {spec}: its study {held!r} is in {url}, and there is no such file {file} from "
                         f"here; give that file's path from here: --prior '{scheme}PATH{NAME_SEP}{name}'")
    return url, name


def _refuse_other_sqlite(url: str) -> None:
    """Refuse an SQLite file that holds no Optuna tables (another program's database) before Optuna opens it:
    it would create its tables in the file (and switch it to a write-ahead log) only to find no study there.

    Raises:
        SearchError: with ``problem`` (as :func:`~edgetune.search.storage.check_sqlite_file`, which runs first:
            an empty or damaged file)."""
    import contextlib
    import sqlite3

    file = sqlite_file(url)
    if file is None or not file.is_file():
        return
    check_sqlite_file(url)
    try:
        with contextlib.closing(sqlite3.connect(f"{file.resolve().as_uri()}?mode=ro", uri=True)) as db:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError:  # unreadable after all: open_storage says how
        return
    if _OPTUNA_TABLE not in tables:
        problem = f"{file} is an SQLite database without Optuna's tables (another program's; nothing was written)"
        raise SearchError(problem, problem=problem)


def load_prior(spec: str) -> PriorStudy:
    """Read the earlier study ``spec`` names (module docs); its measured settings that ran.

    Raises:
        PriorError: no such folder or file, the storage cannot be opened, no study or several without a
            name, or a study with nothing measured (one line).
    """
    url, name = _storage_url(spec)
    try:
        _refuse_other_sqlite(url)
        storage = open_storage(url)
    except SearchError as exc:
        if exc.problem is None:  # a server, a URL: the storage's own line says what to check
            raise PriorError(f"--prior: {exc}") from None
        fix = exc.fix or f"give the output folder of an earlier search, its {STUDY_DB} or its journal file (journal:FILE)"
        raise PriorError(f"--prior {spec}: {exc.problem}; {fix}") from None
    try:
        return _read_prior(spec, url, name, storage)
    finally:  # its connections closed now, not whenever the garbage collector gets to them
        close_storage(storage)


def _read_prior(spec: str, url: str, name: str | None, storage: Any) -> PriorStudy:
    """:func:`load_prior`'s reading of the opened ``storage``."""
    import optuna

    names = sorted(s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False))
    if not names:  # a journal file that is empty, a study file whose study was deleted: naming one cannot help
        raise PriorError(f"--prior {spec} holds no study; give the output folder of an earlier search, its "
                         f"{STUDY_DB} or its journal file (journal:FILE)")
    if name is None:
        if len(names) != 1:
            raise PriorError(f"--prior {spec} holds {len(names)} studies ({', '.join(names)}); name one: "
                             f"--prior '{url}{NAME_SEP}STUDY_NAME'")
        name = names[0]
    elif name not in names:
        raise PriorError(f"--prior {spec}: no study {name!r} there; it holds {', '.join(names) or 'none'}")
    study = optuna.load_study(study_name=name, storage=storage)
    observations = per_setting(o for t in study.get_trials(deepcopy=False)
                               if (o := read_observation(t)) is not None and o.measured and o.ok)
    if not observations:
        raise PriorError(f"--prior {spec}: study {name!r} has no measured setting that ran; search it first")
    return PriorStudy(redact(url), name, read_identity(study) or {}, observations)


# ---------------------------------------------------------------------------------------------- mapping


def _mode_watts(name: str) -> float:
    m = _MODE_WATTS.search(name)
    return float(m.group(1)) if m else _UNBOUNDED_MODE_W


def snap(value: KnobValue, allowed: Sequence[KnobValue]) -> KnobValue:
    """The allowed value nearest ``value``: itself when allowed; numbers by ratio (``log`` distance); names
    (power modes) by the watts in their names (``7W`` -> ``10W``; a name without a number, MAXN, is the
    highest)."""
    if value in allowed:
        return value
    if isinstance(allowed[0], str) or isinstance(value, str):
        w = _mode_watts(str(value))
        return min(allowed, key=lambda a: abs(math.log(_mode_watts(str(a)) / w)))
    v = float(value)
    return min(allowed, key=lambda a: abs(math.log(max(float(a), 1e-12) / max(v, 1e-12))))


def map_to_space(observations: Sequence[Observation], space: SearchSpace,
                 found: Mapping[str, KnobValue] | None = None) -> tuple[Observation, ...]:
    """``observations`` moved into ``space`` (module docs): values snapped, unknown knobs dropped, missing
    knobs as ``found`` (the new device's settings; else the knob's highest value). The first of several
    observations that land on one setting is kept."""
    found = found or {}
    out: dict[Candidate, Observation] = {}
    for obs in observations:
        knobs = obs.candidate.knobs
        setting = []
        for name, allowed in space.knobs:
            value = knobs.get(name, found.get(name, allowed[-1]))
            setting.append((name, snap(value, allowed)))
        cand = Candidate(int(snap(obs.candidate.batch_size, space.batch_sizes)), tuple(setting))
        if cand not in out:
            out[cand] = Observation(cand, measured=True, ok=True, step_time_s=obs.step_time_s,
                                    max_avg_power_w=obs.max_avg_power_w, power_se_w=obs.power_se_w,
                                    peak_power_w=obs.peak_power_w, feasible=False)
    return tuple(out.values())


def moved_count(observations: Sequence[Observation], space: SearchSpace) -> int:
    """How many of ``observations`` :func:`map_to_space` moves: a batch size or a knob value the space does not
    allow (snapped to the nearest), or a knob of the space the observation does not have (filled in)."""
    def moved(obs: Observation) -> bool:
        knobs = obs.candidate.knobs
        return obs.candidate.batch_size not in space.batch_sizes or any(
            name not in knobs or knobs[name] not in allowed for name, allowed in space.knobs)
    return sum(1 for obs in observations if moved(obs))


# ---------------------------------------------------------------------------------------------- models


def _features(rows: Sequence[Mapping[str, float]], names: Sequence[str]) -> np.ndarray:
    """Log values of ``names`` (batch size and knobs; power modes by rank) per row."""
    return np.log(np.array([[max(float(r[n]), 1e-12) for n in names] for r in rows], dtype=float))


class PriorModel:
    """Hardware models of the prior device, one per power-mode group (as a cold search fits them), fitted
    once; a group without prior rows of its own uses the group with the most.

    Args:
        rows: per prior setting, knob values (power modes left out) and ``batch_size``.
        groups: per prior setting, its power-mode group in the new space.
        step_time_s, power_w: what the prior device measured (power: as the budget is judged).
    """

    def __init__(self, rows: Sequence[Mapping[str, float]], groups: Sequence[int], step_time_s: Sequence[float],
                 power_w: Sequence[float], *, min_rows: int = 4) -> None:
        from edgetune.predictors.hardware_model import HardwareModel

        groups = np.asarray(groups, dtype=np.int64)
        self.models: dict[int, Any] = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for g in np.unique(groups):
                sel = np.flatnonzero(groups == g)
                if sel.size >= min_rows:
                    self.models[int(g)] = HardwareModel(random_state=_GP_SEED).fit(
                        [rows[i] for i in sel], [step_time_s[i] for i in sel], [power_w[i] for i in sel])
        if not self.models:
            raise PriorError(f"the prior has {len(rows)} usable settings; at least {min_rows} in one power mode "
                             f"are needed")
        counts = {g: int(np.sum(groups == g)) for g in self.models}
        self.main_group = max(counts, key=lambda g: (counts[g], -g))

    @classmethod
    def of(cls, models: Mapping[int, Any], main_group: int) -> PriorModel:
        """Already fitted hardware models by group (one that has none uses ``main_group``'s): a cold
        search's best-measured power mode as the prior of a mode it has barely measured."""
        if main_group not in models:
            raise ValueError(f"main_group {main_group} has no model")
        self = cls.__new__(cls)
        self.models = dict(models)
        self.main_group = main_group
        return self

    def predict(self, rows: Sequence[Mapping[str, float]], groups: np.ndarray) -> tuple[np.ndarray, ...]:
        """Time, power and their relative (log-space) std per row."""
        n = len(rows)
        t, p, st, sp = (np.full(n, np.nan) for _ in range(4))
        for g in np.unique(groups):
            sel = np.flatnonzero(groups == g)
            model = self.models.get(int(g), self.models[self.main_group])
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                pred = model.predict([rows[i] for i in sel])
            t[sel], p[sel] = pred.step_time_s, pred.power_w
            st[sel] = pred.step_time_std / pred.step_time_s
            sp[sel] = pred.power_std / pred.power_w
        return t, p, st, sp


@dataclass(frozen=True)
class _Correction:
    """A log-space correction of the prior: ``mean`` plus a GP over the setting (None: constant)."""

    mean: float
    mean_std: float
    spread: float
    gp: Any | None

    @classmethod
    def fit(cls, Z: np.ndarray, r: np.ndarray) -> _Correction:
        k = r.size
        if k == 0:
            return cls(0.0, UNKNOWN_DISCREPANCY, 0.0, None)
        mean = float(np.mean(r))
        spread = max(float(np.std(r, ddof=1)), MIN_SPREAD) if k >= MIN_GP_ROWS else DISCREPANCY_SPREAD
        if k < MIN_GP_ROWS:
            return cls(mean, spread / math.sqrt(k), spread, None)
        from sklearn.gaussian_process import GaussianProcessRegressor
        from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

        kernel = (ConstantKernel(spread ** 2, (MIN_SPREAD ** 2, 1.0)) * RBF(1.0, (CORRECTION_MIN_LENGTH, 20.0))
                  + WhiteKernel(MIN_SPREAD ** 2, (1e-6, DISCREPANCY_SPREAD ** 2)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            gp = GaussianProcessRegressor(kernel, normalize_y=False, random_state=_GP_SEED).fit(Z, r - mean)
        return cls(mean, spread / math.sqrt(k), spread, gp)

    def predict(self, Z: np.ndarray, prior_std: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The corrected log ratio's mean at ``Z`` and the std of the corrected prediction (log space), given
        the prior model's own std there (``prior_std``, relative).

        The prior's doubt, and the doubt of the correction's mean, are about values this board's measurements
        show: at a measured setting they are gone, and near one they shrink by the squared correlation the
        fitted kernel gives the two settings (``1 - rho^2``, the share of a variance a noise-free observation
        leaves), whatever noise the GP attributes to the residuals themselves. Without a GP (fewer than
        :data:`MIN_GP_ROWS` measurements) they count in full."""
        n = Z.shape[0]
        if self.gp is None:
            return np.full(n, self.mean), np.sqrt(prior_std ** 2 + self.mean_std ** 2 + self.spread ** 2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mu, sd = self.gp.predict(Z, return_std=True)
        length = float(self.gp.kernel_.k1.k2.length_scale)  # (constant x RBF) + white, as fitted
        d2 = ((Z[:, None, :] - self.gp.X_train_[None, :, :]) ** 2).sum(axis=2) / length ** 2
        left = 1.0 - np.exp(-0.5 * d2.min(axis=1)) ** 2
        return self.mean + mu, np.sqrt(sd ** 2 + left * (self.mean_std ** 2 + prior_std ** 2))


class Transfer:
    """The prior model corrected by the new board's own measurements (module docs, step 3).

    Args:
        prior: the prior device's models.
        names: feature names of the correction (batch size and every knob; power modes by rank).
        scale: per feature, the span of its log values in the new space (the correction's length unit).
        rows, features, groups: the new board's measured settings: model rows (no power modes), correction
            rows (``names``), power-mode groups.
        step_time_s, power_w: what the new board measured.
    """

    def __init__(self, prior: PriorModel, names: Sequence[str], scale: np.ndarray,
                 rows: Sequence[Mapping[str, float]], features: Sequence[Mapping[str, float]], groups: np.ndarray,
                 step_time_s: Sequence[float], power_w: Sequence[float]) -> None:
        self.prior = prior
        self.names = list(names)
        self.scale = np.maximum(np.asarray(scale, dtype=float), _MIN_LOG_SPAN)
        Z = self._z(features) if len(rows) else np.zeros((0, len(self.names)))
        if len(rows):
            t0, p0, _, _ = prior.predict(rows, groups)
            rt = np.log(np.asarray(step_time_s, dtype=float) / t0)
            rp = np.log(np.asarray(power_w, dtype=float) / p0)
        else:
            rt = rp = np.zeros(0)
        self.time = _Correction.fit(Z, rt)
        self.power = _Correction.fit(Z, rp)

    def _z(self, features: Sequence[Mapping[str, float]]) -> np.ndarray:
        return _features(features, self.names) / self.scale

    def predict(self, rows: Sequence[Mapping[str, float]], features: Sequence[Mapping[str, float]],
                groups: np.ndarray) -> tuple[np.ndarray, ...]:
        """Step time, power and their std (absolute) for the new board."""
        t0, p0, st0, sp0 = self.prior.predict(rows, groups)
        Z = self._z(features)
        # the prior model's own doubt is large where the prior device never ran (a sibling's higher clocks);
        # the correction learns it away near this board's measurements (_Correction.predict)
        mt, st = self.time.predict(Z, st0)
        mp, sp = self.power.predict(Z, sp0)
        t, p = t0 * np.exp(mt), p0 * np.exp(mp)
        return t, p, t * st, p * sp
