"""The search configuration: a TOML file, CLI flags on top, loaded into frozen, typed sections.

A config file has a few top-level keys (``device``, ``workload``, ``power_budget_w`` ...) and the sections
``[budget]``, ``[space]``, ``[search]``, ``[protocol]`` and ``[efficiency]``. Each section is a frozen
dataclass (:class:`BudgetSection` ...); a :class:`Config` holds the top-level keys and one of each, so code
reads ``config.search.n_trials``, ``config.protocol.warmup_steps``, ``config.power_budget_w``.

The dataclass fields are the schema: each field's metadata is a :class:`Key` with its check, its help line
and, where the key has one, its command-line :class:`Flag`. :data:`SCHEMA` lists the keys by dotted name
(``search.n_trials``) in file order. Everything else is generated from it, so nothing can drift from the
defaults: the validation, the commented file ``edgetune init`` writes (:func:`example_config`, loaded back
by a test), and the flags of ``edgetune search`` with their help texts and defaults
(:mod:`edgetune.cli.flags`).

:func:`load_config` reads a file, merges overrides (the CLI's flags, which win) and validates everything at
once, raising :class:`ConfigError` with one line that names the key and the fix. An unknown key gets where a
key of that name goes (a top-level key below a ``[section]`` line, a key in another section), else the
nearest known key (difflib); an unknown ``[section]`` the nearest section, or where a key of its name goes.
"""

from __future__ import annotations

import difflib
import math
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from edgetune.power.knobs import KNOBS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = [
    "MEASURE",
    "OBJECTIVES",
    "SAMPLERS",
    "SCHEMA",
    "SECTIONS",
    "BudgetSection",
    "Config",
    "ConfigError",
    "EfficiencySection",
    "Flag",
    "Key",
    "ProtocolSection",
    "SearchSection",
    "SpaceSection",
    "example_config",
    "load_config",
    "validate",
]

OBJECTIVES = ("time", "energy", "throughput", "pareto", "cost")
SAMPLERS = ("auto", "guided", "tpe", "gp", "random")
#: ``efficiency.b_noise = "measure"``: measure the gradient noise scale during the warm-up
MEASURE = "measure"
#: ``efficiency.b_noise_warmups``: the warm-ups whose median ``b_noise = "measure"`` takes. One 20-step warm-up
#: is one draw: nine of each built-in workload, differing only in their seed
#: (experiments/data/convergence/b_noise.csv, ``b_noise_first_steps``), read cnn 3.0-12.3 samples and
#: chartransformer 1.2-13.0, and three of mobilenet's nine nothing positive. The median of five of them spreads
#: about half as much (std of its log over every five of the nine: cnn 0.57 -> 0.34, chartransformer 0.77 ->
#: 0.34, mobilenet 0.20 -> 0.10).
B_NOISE_WARMUPS = 5
#: ``efficiency.b_noise = "workload"`` (the default): the workload's own measured B_noise
WORKLOAD = "workload"
#: the study's SQLite file in the output folder when no ``search.storage`` URL is given
STUDY_DB = "study.db"

MAX_TOLERANCE = 0.5  # fraction: a budget that may be overshot by more than half is no budget
MAX_GUARD_SIGMA = 10.0  # standard errors: a wider band no longer guards against noise, it rejects settings
MAX_MARGIN = 1.0  # fraction of the best: an improvement cannot count only when it doubles the objective
SUGGEST_CUTOFF = 0.5  # difflib similarity a dotted key needs to be suggested for an unknown one
SUGGEST_TAIL_CUTOFF = 0.6  # ... and a key's last part for a bare or misplaced name (stricter: names are short)
#: the largest seed: numpy's RandomState (the guided sampler's) takes seeds below 2**32, and the sampler adds a
#: count of settings to the seed; a larger one failed mid-search, or in a traceback
MAX_SEED = 2**31 - 1

# help groups of the search's flags, in the order `edgetune search --help` lists them
TUNE = "what to tune"
SEARCH = "search"
MEASUREMENT = "measurement and target"


class ConfigError(ValueError):
    """A config key with a bad value, or an unknown key: one line naming the key and the fix."""


# ---------------------------------------------------------------------------------------------- checks
# Each check takes the raw TOML (or flag) value and returns the clean value or raises ValueError with the
# fix (the caller prefixes the key and where it came from). A check accepts its own clean values again.


def _number(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False, unit: str = "",
            allow_none: bool = False) -> Callable[[Any], float | None]:
    def check(v: Any) -> float | None:
        if v is None and allow_none:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"must be a number{' of ' + unit if unit else ''}, got {v!r}")
        if lo is not None and (v <= lo if lo_open else v < lo):
            raise ValueError(f"must be {'>' if lo_open else '>='} {lo:g}, got {v!r}")
        if hi is not None and v > hi:
            raise ValueError(f"must be <= {hi:g}, got {v!r}")
        return float(v)
    return check


def _integer(lo: int = 0, hi: int | None = None) -> Callable[[Any], int]:
    def check(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"must be a whole number >= {lo}, got {v!r}")  # noqa: TRY004
        if v < lo:
            raise ValueError(f"must be >= {lo}, got {v!r}")
        if hi is not None and v > hi:
            raise ValueError(f"must be <= {hi}, got {v!r}")
        return int(v)
    return check


def _boolean(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"must be true or false, got {v!r}")  # noqa: TRY004
    return v


def _text(nonempty: bool = True) -> Callable[[Any], str]:
    def check(v: Any) -> str:
        if not isinstance(v, str):
            raise ValueError(f"must be a quoted string, got {v!r}")  # noqa: TRY004
        if nonempty and not v.strip():
            raise ValueError("must not be empty")
        return v.strip()
    return check


def _choice(options: tuple[str, ...]) -> Callable[[Any], str]:
    def check(v: Any) -> str:
        if not isinstance(v, str) or v.lower() not in options:
            near = difflib.get_close_matches(str(v).lower(), options, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise ValueError(f"must be one of {', '.join(options)}, got {v!r}{hint}")
        return v.lower()
    return check


def _batch_sizes(v: Any) -> tuple[int, ...] | None:
    if v is None:
        return None
    if not isinstance(v, (list, tuple)) or not v:  # a tuple: an already validated value
        raise ValueError(f"must be a non-empty list of whole numbers, e.g. [16, 32, 64], got {v!r}")
    if any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in v):
        raise ValueError(f"must hold whole numbers >= 1, got {v!r}")
    if len(set(v)) != len(v):
        raise ValueError(f"lists a batch size twice: {v!r}")
    return tuple(sorted(v))


def _knob_names(v: Any) -> tuple[str, ...] | None:
    if v is None or v == "all":
        return None
    if not isinstance(v, (list, tuple)) or any(not isinstance(k, str) for k in v):
        raise ValueError(f'must be "all" or a list of knob names, e.g. ["gpu_freq", "emc_freq"], got {v!r}')
    if len(set(v)) != len(v):  # a knob twice would be two dimensions of the space, searched apart
        raise ValueError(f"lists a knob twice: {list(v)!r}")
    return tuple(v)


def _knob_values(v: Any) -> Mapping[str, tuple[Any, ...]]:
    if not isinstance(v, Mapping):
        raise ValueError('must be a table of knob = [values], e.g. gpu_freq = ["306MHz", "max"]')  # noqa: TRY004
    out: dict[str, tuple[Any, ...]] = {}
    for name, values in v.items():
        if not isinstance(values, (list, tuple)) or not values:
            raise ValueError(f"{name} must be a non-empty list of values, got {values!r}")
        if any(isinstance(x, bool) or not isinstance(x, (int, float, str)) for x in values):
            raise ValueError(f"{name} must list numbers or strings (\"918MHz\", \"max\"), got {values!r}")
        out[name] = tuple(values)
    return MappingProxyType(out)


def _real_steps(v: Any) -> int | None:
    if v == "all" or v is None:  # None: an already validated "all"
        return None
    return _integer(0)(v)


def _b_noise(v: Any) -> float | str:
    if v in (MEASURE, WORKLOAD):
        return v
    try:
        return _number(0.0, lo_open=True)(v)  # type: ignore[return-value]
    except ValueError:
        raise ValueError(f'must be a number of samples > 0, "{WORKLOAD}" or "{MEASURE}", got {v!r}') from None


# ---------------------------------------------------------------------------------------------- flag text
# A flag's text -> the raw value its key's check takes; ValueError with the fix.


def _flag_number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"expected a number, got {text!r}") from None


def _flag_bool(text: str) -> bool:
    """``true`` / ``false`` (any case): how a switch's default is stated in its help."""
    if text.strip().lower() not in ("true", "false"):
        raise ValueError(f"expected true or false, got {text!r}")
    return text.strip().lower() == "true"


def _flag_int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"expected a whole number, got {text!r}") from None


def _flag_items(text: str) -> list[str]:
    """A list flag's items: separated by commas, spaces or both (``16,32``, ``"16 32"``, ``"16, 32"``)."""
    return [x for x in re.split(r"[,\s]+", text) if x]


def _flag_int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in _flag_items(text)]
    except ValueError:
        raise ValueError(f"expected comma-separated whole numbers (16,32,64), got {text!r}") from None


def _flag_names(text: str) -> Any:
    return "all" if text.strip() == "all" else _flag_items(text)


def _flag_int_or_all(text: str) -> Any:
    if text == "all":
        return text
    try:
        return int(text)
    except ValueError:
        raise ValueError(f'expected a whole number or "all", got {text!r}') from None


def _flag_number_or_measure(text: str) -> Any:
    if text in (MEASURE, WORKLOAD):
        return text
    try:
        return float(text)
    except ValueError:
        raise ValueError(f'expected a number of samples, "{WORKLOAD}" or "{MEASURE}", got {text!r}') from None


# ---------------------------------------------------------------------------------------------- schema


@dataclass(frozen=True)
class Flag:
    """The ``edgetune search`` flag that overrides a key.

    Attributes:
        name: the long option (``--n-trials``).
        parse: the flag's text -> the raw value the key's check takes (ValueError with the fix).
        metavar: placeholder in the help (argparse's default: the option's name in capitals).
        group: help section (None: the parser's own options).
        short: a one-letter alias (``-o``).
    """

    name: str
    parse: Callable[[str], Any] = str
    metavar: str | None = None
    group: str | None = None
    short: str | None = None
    switch: bool = False  # a flag without a value that sets the key to true

    @property
    def dest(self) -> str:
        """The argparse attribute the flag's value lands in (``n_trials``)."""
        return self.name.lstrip("-").replace("-", "_")

    @property
    def option_strings(self) -> tuple[str, ...]:
        return (self.name, self.short) if self.short else (self.name,)


@dataclass(frozen=True)
class Key:
    """One config key.

    Attributes:
        check: raw value -> clean value; ValueError naming the fix.
        help: the line above the key in ``edgetune init``'s file, and its flag's help.
        example: shown (commented out) in the example file instead of the default.
        flag: its ``edgetune search`` flag, if it has one.
        default_text: how the help states the default where the value says nothing by itself
            (``None`` for "every writable knob", ``""`` for "SQLite in the output folder").
        name, section, attr, default: filled from the dataclass field (``search.n_trials``, ``search``,
            ``n_trials``, 40); ``section`` is ``""`` for a top-level key.
    """

    check: Callable[[Any], Any]
    help: str
    example: str | None = None
    flag: Flag | None = None
    default_text: str | None = None
    name: str = ""
    section: str = ""
    attr: str = ""
    default: Any = None

    @property
    def stated_default(self) -> str | None:
        """The default as help texts state it (None: there is none to state)."""
        if self.default_text is not None:
            return self.default_text
        return None if self.default is None else _show(self.default)

    def value_in(self, config: Config) -> Any:
        """This key's value in ``config``."""
        return getattr(getattr(config, self.section) if self.section else config, self.attr)


_KEY = "edgetune.config.key"  # field metadata: the field's Key
_SECTION = "edgetune.config.section"  # field metadata: the field is a section


def _key(default: Any, check: Callable[[Any], Any], help: str, **options: Any) -> Any:
    """A schema field: a dataclass field whose metadata is its :class:`Key`."""
    meta = {_KEY: Key(check, help, **options)}
    if isinstance(default, Mapping):  # a mapping is mutable: each config gets its own read-only view
        items = dict(default)
        return field(default_factory=lambda: MappingProxyType(dict(items)), metadata=meta)
    return field(default=default, metadata=meta)


def _show(value: Any) -> str:
    """A clean value as a help text or the example file shows it."""
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ",".join(_show(v) for v in value)
    return str(value)


@dataclass(frozen=True)
class BudgetSection:
    """``[budget]``: how the power budget is judged."""

    window_s: float = _key(1.0, _number(0.0, lo_open=True, unit="seconds"),
                           "the budget holds when the moving average over this window never exceeds it",
                           flag=Flag("--window", _flag_number, "S", TUNE))
    tolerance: float = _key(0.0, _number(0.0, MAX_TOLERANCE), "allowed overshoot as a fraction (0.02 = 2%)",
                            flag=Flag("--tolerance", _flag_number, group=TUNE))
    guard_sigma: float = _key(2.0, _number(0.0, MAX_GUARD_SIGMA),
                              "guard band: standard errors of the measured average added before comparing "
                              "with the budget (0: none)", flag=Flag("--guard-sigma", _flag_number, "K", TUNE))


@dataclass(frozen=True)
class SpaceSection:
    """``[space]``: the batch sizes and knob values searched."""

    batch_sizes: tuple[int, ...] | None = _key(
        None, _batch_sizes, "batch sizes to try", example="[16, 32, 64, 128, 256]",
        default_text="powers of two from the workload's default / 8 to x 8",
        flag=Flag("--batch-sizes", _flag_int_list, "B,B,..", TUNE))
    knobs: tuple[str, ...] | None = _key(
        None, _knob_names, 'knobs to tune; "all" = every writable knob of the device',
        example='["gpu_freq", "emc_freq"]', default_text="all", flag=Flag("--knobs", _flag_names, "K,K,..", TUNE))
    values: Mapping[str, tuple[Any, ...]] = _key(
        {}, _knob_values, "allowed subset of values per knob (units accepted: \"918MHz\", \"max\")",
        example='{ gpu_freq = ["306MHz", "624.75MHz", "max"] }')


@dataclass(frozen=True)
class SearchSection:
    """``[search]``: the study (sampler, storage) and when it stops."""

    n_trials: int = _key(40, _integer(1), "most settings measured (baseline probes included); the guided "
                         "sampler usually stops sooner; the default takes about half a minute on the twin on "
                         "2 CPU cores", flag=Flag("--n-trials", _flag_int, "N", SEARCH))
    sampler: str = _key("auto", _choice(SAMPLERS),
                        "auto: the measured winner, guided (experiments/sampler_comparison.py); guided "
                        "(predictor-guided), tpe, gp or random", flag=Flag("--sampler", group=SEARCH))
    storage: str = _key("", _text(nonempty=False), "Optuna storage URL shared by a fleet (postgresql://..., "
                        "sqlite:///..., journal:FILE)", example='"postgresql://user@host/edgetune"',
                        default_text=f"sqlite:///<output>/{STUDY_DB}", flag=Flag("--storage", group=SEARCH))
    study_name: str = _key("", _text(nonempty=False), "study name; the same storage and name resume a study",
                           default_text="<device>-<workload>-<budget>W-<objective>",
                           flag=Flag("--study-name", group=SEARCH))
    patience: int = _key(12, _integer(0), "with --sampler tpe, gp or random: stop after this many trials "
                         "without an improvement larger than the margin (0: never); the guided sampler stops by "
                         "its own rule", flag=Flag("--patience", _flag_int, group=SEARCH))
    margin: float = _key(0.01, _number(0.0, MAX_MARGIN), "improvement that counts, as a fraction of the best",
                         flag=Flag("--margin", _flag_number, group=SEARCH))
    timeout_s: float = _key(0.0, _number(0.0, unit="seconds"), "stop starting trials after this many seconds "
                            "of wall time (0: no limit)", flag=Flag("--timeout", _flag_number, "S", SEARCH))
    prior: str = _key("", _text(nonempty=False), "start from an earlier study of another board, budget or power "
                      "mode: its output folder, or a storage URL with #STUDY_NAME; it guides the search, only "
                      "new measurements count", example='"runs/orin-nano"', default_text="none",
                      flag=Flag("--prior", metavar="FOLDER_OR_URL", group=SEARCH))
    eta: float = _key(0.5, _number(0.0, 1.0), "weight of energy in the cost objective (Zeus's eta; 1: energy "
                      "only, 0: time only)", flag=Flag("--eta", _flag_number, group=SEARCH))
    confirm: int = _key(3, _integer(0), "before the pick, up to this many contenders whose measured figures are "
                        "within the run-to-run noise of the best are measured again (3 more windows each at most; "
                        "0: none); they add windows, not settings", flag=Flag("--confirm", _flag_int, "N", SEARCH))
    soak_s: float = _key(360.0, _number(0.0, unit="seconds"),
                         "before the search stops, its pick is trained at for this many device seconds and the "
                         "board temperature read, to learn how much more it draws once the board is warm; every "
                         "setting must then hold the budget by that much more (0: no soak)",
                         flag=Flag("--soak-s", _flag_number, group=SEARCH))


@dataclass(frozen=True)
class ProtocolSection:
    """``[protocol]``: how one setting is measured (the search's ``MeasurementProtocol``)."""

    warmup_steps: int = _key(1, _integer(0), "real training steps after the knobs are set, before measuring",
                             flag=Flag("--warmup-steps", _flag_int, group=MEASUREMENT))
    measure_steps: int = _key(5, _integer(1), "the measured window holds at least this many steps",
                              flag=Flag("--measure-steps", _flag_int, group=MEASUREMENT))
    measure_s: float = _key(2.0, _number(0.0, unit="seconds"),
                            "... and spans at least this many seconds of device time",
                            flag=Flag("--measure-s", _flag_number, group=MEASUREMENT))
    real_steps: int | None = _key(1, _real_steps, "on the simulated twin: how many window steps run the real "
                                  'training step (the twin times the rest); "all" runs every one',
                                  flag=Flag("--real-steps", _flag_int_or_all, group=MEASUREMENT))


@dataclass(frozen=True)
class EfficiencySection:
    """``[efficiency]``: steps to target, S_min (1 + B_noise / b) (McCandlish et al. 2018)."""

    s_min: float = _key(1000.0, _number(0.0, lo_open=True, unit="steps"),
                        "steps to target at a very large batch (S_min, McCandlish et al. 2018)",
                        flag=Flag("--s-min", _flag_number, group=MEASUREMENT))
    b_noise: float | str = _key(WORKLOAD, _b_noise, f'gradient noise scale B_noise in samples, "{WORKLOAD}" (the '
                                f"workload's measured value; measured as with \"{MEASURE}\" for one without) or "
                                f'"{MEASURE}" (from gradient norms during the warm-up)',
                                flag=Flag("--b-noise", _flag_number_or_measure, group=MEASUREMENT))
    b_noise_warmups: int = _key(B_NOISE_WARMUPS, _integer(1), f'with b_noise = "{MEASURE}": the warm-ups '
                                "whose median it takes, each on the workload built again with the next seed (fresh batches and, "
                                "unless the builder loads them, weights); one warm-up is one draw, which "
                                "spreads several-fold",
                                flag=Flag("--b-noise-warmups", _flag_int, group=MEASUREMENT))
    steps_to_target: str = _key("", _text(nonempty=False), "a CSV of your own training runs to the target (columns "
                                "batch_size, steps; optional workload): their median steps per batch size "
                                "replace the noise-scale law (between them interpolated, outside them the law "
                                "fitted to them)", example='"runs.csv"', default_text="none: the law",
                                flag=Flag("--steps-to-target", metavar="CSV", group=MEASUREMENT))
    known_convergence: bool = _key(False, _boolean, "on trace:<table.csv>: the table's epochs to target of every "
                                   "batch size are known from the start (a recurring job); otherwise the search "
                                   "sees a batch size's only once it measured it",
                                   flag=Flag("--known-convergence", _flag_bool, group=MEASUREMENT,
                                             switch=True))


@dataclass(frozen=True)
class Config:
    """A validated configuration: the top-level keys and one frozen section per ``[section]``.

    Build one with :func:`load_config` or :func:`validate`; ``Config()`` holds every default (and no budget).
    ``path`` is the file it was read from; ``sources`` maps a dotted key to where its value came from (the
    file, or the flag that overrode it).
    """

    device: str = _key("auto", _text(), "auto, sim:<profile> (sim:orin-nano, sim:orin-agx ...), jetson, "
                       "jtop, nvml[:i], rapl, trace:<table.csv>", flag=Flag("--device", group=TUNE))
    torch_device: str = _key("auto", _text(), "where training runs: auto (the GPU the device measures; the CPU "
                             "for rapl, sim: and trace:), or a torch device: cpu, cuda, cuda:<n>",
                             flag=Flag("--torch-device", group=TUNE))
    workload: str = _key("cnn", _text(), "cnn, mobilenet, chartransformer, or package.module:function of your "
                         "code", flag=Flag("--workload", group=TUNE))
    power_budget_w: float | None = _key(
        None, _number(0.0, lo_open=True, unit="watts", allow_none=True),
        "the power budget in watts, judged by the moving average of board power; the search needs one",
        example="10.0", flag=Flag("--budget", _flag_number, "W", TUNE))
    objective: str = _key("time", _choice(OBJECTIVES), "time (time to target), energy (energy to target), "
                          "throughput (samples/s), pareto (time and energy), cost (Zeus: eta x energy + (1 - eta) x max power x "
                          "time, see search.eta)", flag=Flag("--objective", group=TUNE))
    output: str = _key("edgetune-out", _text(), f"output folder: best.json, trials.csv, {STUDY_DB}, plots; each "
                       "study in its own subfolder <device>-<workload>-<objective>-<budget>, except with --output",
                       flag=Flag("--output", short="-o"))
    seed: int = _key(0, _integer(0, MAX_SEED), "seed of the sampler, the workload's weights, data and torch's generators as it trains, and the twin",
                     flag=Flag("--seed", _flag_int, group=SEARCH))
    budget: BudgetSection = field(default_factory=BudgetSection, metadata={_SECTION: True})
    space: SpaceSection = field(default_factory=SpaceSection, metadata={_SECTION: True})
    search: SearchSection = field(default_factory=SearchSection, metadata={_SECTION: True})
    protocol: ProtocolSection = field(default_factory=ProtocolSection, metadata={_SECTION: True})
    efficiency: EfficiencySection = field(default_factory=EfficiencySection, metadata={_SECTION: True})
    path: Path | None = None
    sources: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), compare=False)

    def label(self, name: str) -> str:
        """Where the dotted key ``name``'s value came from, as an error about it starts: the flag that set it
        (``--budget``), else ``FILE: power_budget_w``; the bare key when no source is known."""
        origin = self.sources.get(name)
        return name if origin is None else _label(origin, name)

    def flat(self) -> dict[str, Any]:
        """Every key's value by dotted name (``{"search.n_trials": 40, ...}``), in :data:`SCHEMA` order."""
        return {name: key.value_in(self) for name, key in SCHEMA.items()}

    def storage_url(self) -> str:
        """``search.storage``, or the SQLite file in the output folder."""
        if self.search.storage:
            return self.search.storage
        return f"sqlite:///{(Path(self.output) / STUDY_DB).resolve()}"

    def study_name(self, device_name: str, workload_name: str) -> str:
        """``search.study_name``, or one made of the device, workload, budget and objective."""
        if self.search.study_name:
            return self.search.study_name
        budget = "unconstrained" if self.power_budget_w is None else f"{self.power_budget_w:g}W"
        return f"{device_name}-{workload_name}-{budget}-{self.objective}"

    def with_values(self, **changes: Any) -> Config:
        """A copy with dotted keys replaced (``with_values(**{"search.n_trials": 5})``), validated."""
        return validate({**self.flat(), **changes}, path=self.path, sources=self.sources)


def _bind(f: Field, section: str) -> Key:
    default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
    name = f"{section}.{f.name}" if section else f.name
    return replace(f.metadata[_KEY], name=name, section=section, attr=f.name, default=default)


#: ``[section]`` name -> its dataclass, in file order.
SECTIONS: dict[str, type] = {f.name: f.default_factory for f in fields(Config) if f.metadata.get(_SECTION)}  # type: ignore[misc]

#: Every key by dotted name (``section.key`` for keys in a section), in the example file's order.
SCHEMA: dict[str, Key] = {
    **{f.name: _bind(f, "") for f in fields(Config) if _KEY in f.metadata},
    **{f"{sec}.{g.name}": _bind(g, sec) for sec, cls in SECTIONS.items() for g in fields(cls)},
}


# ---------------------------------------------------------------------------------------------- loading


def _flatten(data: Mapping[str, Any], where: str) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if key in SECTIONS:
            if not isinstance(value, dict):
                raise _section_given_a_value(key, value, where)
            for sub, v in value.items():
                flat[f"{key}.{sub}"] = v
        elif isinstance(value, dict) and key not in SCHEMA:  # a [table] (no top-level key is one)
            raise _unknown_section(key, where)
        else:
            flat[key] = value
    return flat


def _section_given_a_value(name: str, value: Any, where: str) -> ConfigError:
    """``budget = 7``: a section's name given a value; names the section's keys, and the top-level key of
    that name's meaning where there is one (``power_budget_w``)."""
    keys = ", ".join(k.split(".", 1)[1] for k in SCHEMA if k.startswith(f"{name}."))
    shown = _toml_value(value)  # as written in the file (true, not True)
    line = f"{where}: {name} = {shown}: [{name}] is a section (keys {keys}), not a value"
    top = next((k for k in SCHEMA if "." not in k and name in k), None)
    if top is not None:
        line += f"; for {top}, write {top} = {shown} above the first [section] line"
    return ConfigError(line)


def _knob_hint(knob: str) -> str:
    return f"knob values go in the [space] section: values = {{ {knob} = [...] }}, and knobs = [\"{knob}\", ...]"


def _key_named(tail: str) -> str | None:
    """The dotted key whose last part is ``tail`` exactly (``batch_sizes`` -> ``space.batch_sizes``), if any."""
    return next((k for k in SCHEMA if k.split(".")[-1] == tail), None)


def _unknown_section(name: str, where: str) -> ConfigError:
    """A ``[name]`` table that is not a section: the nearest section, or where a key of that name goes."""
    start = f"{where}: unknown section [{name}]"
    near = difflib.get_close_matches(name.lower(), SECTIONS, n=1, cutoff=SUGGEST_CUTOFF)
    if near:
        return ConfigError(f"{start}; did you mean [{near[0]}]?")
    if name in KNOBS:
        return ConfigError(f"{start}; {_knob_hint(name)}")
    key = _key_named(name)
    if key is not None and SCHEMA[key].section:
        sec = SCHEMA[key].section
        return ConfigError(f"{start}; {name} is a key of the [{sec}] section: {name} = ... below a [{sec}] line")
    if key is not None:
        return ConfigError(f"{start}; {name} is a top-level key: {name} = ... above the first [section] line")
    return ConfigError(f"{start}; the sections are {', '.join(f'[{s}]' for s in SECTIONS)}")


def _unknown(key: str, where: str) -> ConfigError:
    section, _, tail = key.rpartition(".")
    if tail in KNOBS:  # a knob named where a key goes
        return ConfigError(f"{where}: unknown key {key!r}; {_knob_hint(tail)}")
    placed = _key_named(tail)
    if placed is not None:  # a known key in the wrong place: say where it goes
        home = SCHEMA[placed].section
        if not home:  # a top-level key below a [section] line belongs to that section in TOML
            return ConfigError(f"{where}: unknown key {key!r}; {tail} is a top-level key: move it above the first "
                               f"[section] line (in TOML every key below a [{section}] line belongs to [{section}])")
        return ConfigError(f"{where}: unknown key {key!r}; {tail} belongs in the [{home}] section "
                           f"(did you mean {placed!r}?)")
    near = difflib.get_close_matches(key, SCHEMA, n=1, cutoff=SUGGEST_CUTOFF)
    if not near:  # a known key in the wrong section, or a bare name: compare the last part
        tails = {k.split(".")[-1]: k for k in SCHEMA}
        match = difflib.get_close_matches(key.split(".")[-1], tails, n=1, cutoff=SUGGEST_TAIL_CUTOFF)
        near = [tails[match[0]]] if match else []
    hint = f"; did you mean {near[0]!r}?" if near else f"; known keys: {', '.join(SCHEMA)}"
    return ConfigError(f"{where}: unknown key {key!r}{hint}")


def _build(clean: Mapping[str, Any], path: Path | None, sources: Mapping[str, str]) -> Config:
    """A :class:`Config` from clean values by dotted key (keys left out keep their defaults)."""
    top: dict[str, Any] = {}
    parts: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    for name, value in clean.items():
        key = SCHEMA[name]
        (parts[key.section] if key.section else top)[key.attr] = value
    sections = {name: cls(**parts[name]) for name, cls in SECTIONS.items()}
    return Config(**top, **sections, path=path, sources=MappingProxyType(dict(sources)))


def _label(origin: str, name: str) -> str:
    """How an error names key ``name`` set by ``origin``: the flag itself, else ``origin: name``."""
    return origin if origin.startswith("--") else f"{origin}: {name}"


def validate(raw: Mapping[str, Any], *, path: Path | None = None,
             sources: Mapping[str, str] | None = None) -> Config:
    """Check every dotted key of ``raw``; fill defaults. ``sources`` names where a key came from."""
    sources = dict(sources or {})
    where_default = str(path) if path else "config"
    for name in raw:
        if name not in SCHEMA:
            raise _unknown(name, sources.get(name, where_default))
    clean: dict[str, Any] = {}
    for name, key in SCHEMA.items():
        if name not in raw:
            continue
        try:
            clean[name] = key.check(raw[name])
        except ValueError as exc:
            raise ConfigError(f"{_label(sources.get(name, where_default), name)} {exc}") from None
    return _build(clean, path, sources)


def load_config(path: str | Path | None = None, overrides: Mapping[str, Any] | None = None,
                override_sources: Mapping[str, str] | None = None) -> Config:
    """Read ``path`` (TOML; None: defaults only), apply ``overrides`` (dotted keys, e.g. from CLI flags).

    An override of None leaves the file's value (a flag not given). ``override_sources`` names where an
    override came from (``--budget``): its error then names the flag instead of the key.

    Raises:
        ConfigError: unreadable file, bad TOML, unknown key or bad value; one line.
    """
    raw: dict[str, Any] = {}
    p = Path(path) if path is not None else None
    if p is not None:
        try:
            text = p.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError(f"config file {p} does not exist; create one with `edgetune init {p}`") from None
        except OSError as exc:
            raise ConfigError(f"cannot read config file {p}: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"config file {p} is not a text TOML file (byte {exc.start} is not UTF-8); "
                              f"write one with `edgetune init`") from None
        try:
            raw = _flatten(tomllib.loads(text), str(p))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{p}: not valid TOML: {exc}") from None
    sources = {k: str(p) for k in raw}
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        raw[key] = value
        sources[key] = (override_sources or {}).get(key, "command line")
    return validate(raw, path=p, sources=sources)


# ---------------------------------------------------------------------------------------------- example


def _toml_value(v: Any) -> str:
    if v is None:
        return '""'
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, float):
        return f"{v:g}" if v != int(v) else f"{v:.1f}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"
    return str(v)


def example_config() -> str:
    """The commented example configuration ``edgetune init`` writes (every key, with its default)."""
    lines = [
        "# edgetune configuration: `edgetune search --config edgetune.toml` (flags override these keys).",
        "# Every key is optional except the budget (here or --budget). Commented keys show an example value.",
        "# Relative paths (output, trace:<table.csv>, steps_to_target, prior, a workload's .py file) are read from the",
        "# folder edgetune runs in, not from this file's folder.",
        "",
    ]
    section = ""
    for key in SCHEMA.values():
        if key.section != section:
            lines += ["", f"[{key.section}]"]
            section = key.section
        lines.append(f"# {key.help}" + (f" (default {key.default_text})" if key.default_text else ""))
        if key.name == "power_budget_w":
            lines.append(f"{key.attr} = {key.example}")
        elif key.default is None or key.default == {} or key.default == "" and key.example:
            lines.append(f"# {key.attr} = {key.example}")
        else:
            lines.append(f"{key.attr} = {_toml_value(key.default)}")
    return "\n".join(lines) + "\n"
