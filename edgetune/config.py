"""The search configuration: a TOML file, CLI flags on top, every key validated.

One flat table of keys (``device``, ``workload``, ``power_budget_w`` ...) and a few sections
(``[budget]``, ``[space]``, ``[search]``, ``[protocol]``, ``[efficiency]``). :data:`SCHEMA` lists every
key with its default and its check; :func:`load_config` reads a file, merges overrides (the CLI's flags,
which win) and validates everything at once, raising :class:`ConfigError` with one line that names the key
and the fix. An unknown key gets the nearest known key as a suggestion (difflib).

:func:`example_config` is the commented file ``edgetune init`` writes; a test loads it back, so the example
and the schema cannot drift apart.
"""

from __future__ import annotations

import difflib
import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgetune.power.knobs import KNOBS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = ["OBJECTIVES", "SAMPLERS", "SCHEMA", "Config", "ConfigError", "example_config", "load_config", "validate"]

OBJECTIVES = ("time", "energy", "throughput", "pareto")
SAMPLERS = ("auto", "guided", "tpe", "gp", "random")


class ConfigError(ValueError):
    """A config key with a bad value, or an unknown key: one line naming the key and the fix."""


# ---------------------------------------------------------------------------------------------- checks
# Each check takes the raw TOML value and returns the clean value or raises ValueError with the fix
# (the caller prefixes the key and where it came from).


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


def _integer(lo: int = 0) -> Callable[[Any], int]:
    def check(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"must be a whole number >= {lo}, got {v!r}")  # noqa: TRY004
        if v < lo:
            raise ValueError(f"must be >= {lo}, got {v!r}")
        return int(v)
    return check


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
    return tuple(v)


def _knob_values(v: Any) -> dict[str, tuple[Any, ...]]:
    if not isinstance(v, dict):
        raise ValueError('must be a table of knob = [values], e.g. gpu_freq = ["306MHz", "max"]')  # noqa: TRY004
    out: dict[str, tuple[Any, ...]] = {}
    for name, values in v.items():
        if not isinstance(values, (list, tuple)) or not values:
            raise ValueError(f"{name} must be a non-empty list of values, got {values!r}")
        if any(isinstance(x, bool) or not isinstance(x, (int, float, str)) for x in values):
            raise ValueError(f"{name} must list numbers or strings (\"918MHz\", \"max\"), got {values!r}")
        out[name] = tuple(values)
    return out


def _real_steps(v: Any) -> int | None:
    if v == "all" or v is None:  # None: an already validated "all"
        return None
    return _integer(0)(v)


def _b_noise(v: Any) -> float | str:
    if v == "measure":
        return "measure"
    try:
        return _number(0.0, lo_open=True)(v)  # type: ignore[return-value]
    except ValueError:
        raise ValueError(f'must be a number of samples > 0 or "measure", got {v!r}') from None


@dataclass(frozen=True)
class Key:
    """One config key: default, check, and the line ``edgetune init`` writes above it."""

    default: Any
    check: Callable[[Any], Any]
    help: str
    example: str | None = None  # shown in the example file instead of the default (commented out)


#: Every key, dotted ``section.key`` for keys in a section. Order is the example file's order.
SCHEMA: dict[str, Key] = {
    "device": Key("auto", _text(), "auto, sim:<profile> (sim:orin-nano, sim:orin-agx ...), jetson, nvml[:i], "
                  "rapl, trace:<table.csv>"),
    "workload": Key("cnn", _text(), "cnn, mobilenet, chartransformer, or package.module:function of your code"),
    "power_budget_w": Key(None, _number(0.0, lo_open=True, unit="watts", allow_none=True),
                          "the power budget in watts, judged by the moving average of board power", "10.0"),
    "objective": Key("time", _choice(OBJECTIVES),
                     "time (time to target), energy (energy to target), throughput (samples/s), pareto "
                     "(time and energy)"),
    "output": Key("edgetune-out", _text(), "output folder: best.json, trials.csv, study.db, plots"),
    "seed": Key(0, _integer(0), "seed of the sampler, the workload's synthetic data and the twin"),
    "budget.window_s": Key(1.0, _number(0.0, lo_open=True, unit="seconds"),
                           "the budget holds when the moving average over this window never exceeds it"),
    "budget.tolerance": Key(0.0, _number(0.0, 0.5), "allowed overshoot as a fraction (0.02 = 2%)"),
    "budget.guard_sigma": Key(2.0, _number(0.0, 10.0), "guard band: standard errors of the measured average "
                              "added before comparing with the budget (0: none)"),
    "space.batch_sizes": Key(None, _batch_sizes, "batch sizes to try; default: powers of two from the "
                             "workload's default / 8 to x 8", "[16, 32, 64, 128, 256]"),
    "space.knobs": Key(None, _knob_names, 'knobs to tune; "all" = every writable knob of the device',
                       '["gpu_freq", "emc_freq"]'),
    "space.values": Key({}, _knob_values, "allowed subset of values per knob (units accepted: \"918MHz\", "
                        "\"max\")", '{ gpu_freq = ["306MHz", "624.75MHz", "max"] }'),
    "search.n_trials": Key(40, _integer(1), "most settings measured (baseline probes included); the guided "
                           "sampler usually stops sooner; 40 take about half a minute on the twin on 2 CPU cores"),
    "search.sampler": Key("auto", _choice(SAMPLERS),
                          "auto: the measured winner, guided (experiments/sampler_comparison.py); guided "
                          "(predictor-guided), tpe, gp or random"),
    "search.storage": Key("", _text(nonempty=False),
                          "Optuna storage URL shared by a fleet (postgresql://..., sqlite:///...); "
                          "default: sqlite in the output folder", '"postgresql://user@host/edgetune"'),
    "search.study_name": Key("", _text(nonempty=False), "default: <device>-<workload>-<budget>W-<objective>"),
    "search.patience": Key(12, _integer(0), "stop after this many trials without an improvement larger "
                           "than the margin (0: never)"),
    "search.margin": Key(0.01, _number(0.0, 1.0), "improvement that counts, as a fraction of the best"),
    "search.timeout_s": Key(0.0, _number(0.0, unit="seconds"), "stop starting trials after this many "
                            "seconds of wall time (0: no limit)"),
    "protocol.warmup_steps": Key(1, _integer(0), "real training steps after the knobs are set, before measuring"),
    "protocol.measure_steps": Key(5, _integer(1), "the measured window holds at least this many steps"),
    "protocol.measure_s": Key(2.0, _number(0.0, unit="seconds"),
                              "... and spans at least this many seconds of device time"),
    "protocol.real_steps": Key(1, _real_steps, 'on the simulated twin: how many window steps run the real '
                               'training step (the twin times the rest); "all" runs every one'),
    "efficiency.s_min": Key(1000.0, _number(0.0, lo_open=True, unit="steps"),
                            "steps to target at a very large batch (S_min, McCandlish et al. 2018)"),
    "efficiency.b_noise": Key(256.0, _b_noise, 'gradient noise scale B_noise in samples, or "measure" '
                              "(from gradient norms during the warm-up)"),
}

SECTIONS = sorted({k.split(".")[0] for k in SCHEMA if "." in k})


@dataclass(frozen=True)
class Config:
    """A validated configuration (see :data:`SCHEMA`); ``values`` maps dotted keys to clean values."""

    values: Mapping[str, Any]
    path: Path | None = None
    sources: Mapping[str, str] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    # the names the rest of edgetune reads
    @property
    def budget_w(self) -> float | None:
        return self.values["power_budget_w"]

    def storage_url(self) -> str:
        url = self["search.storage"]
        if url:
            return url
        return f"sqlite:///{(Path(self['output']) / 'study.db').resolve()}"

    def study_name(self, device_name: str, workload_name: str) -> str:
        if self["search.study_name"]:
            return self["search.study_name"]
        budget = "unconstrained" if self.budget_w is None else f"{self.budget_w:g}W"
        return f"{device_name}-{workload_name}-{budget}-{self['objective']}"

    def with_values(self, **changes: Any) -> Config:
        """A copy with dotted keys replaced (``with_values(**{"search.n_trials": 5})``), validated."""
        return validate({**self.values, **changes}, path=self.path)


def _flatten(data: Mapping[str, Any], where: str) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if key in SECTIONS:
            if not isinstance(value, dict):
                raise ConfigError(f"{where}: [{key}] must be a table (a [{key}] section), got {value!r}")
            for sub, v in value.items():
                flat[f"{key}.{sub}"] = v
        else:
            flat[key] = value
    return flat


def _unknown(key: str, where: str) -> ConfigError:
    if key.split(".")[-1] in KNOBS:  # a knob named where a key goes
        knob = key.split(".")[-1]
        return ConfigError(f"{where}: unknown key {key!r}; knob values go in the [space] section: "
                           f"values = {{ {knob} = [...] }}, and knobs = [\"{knob}\", ...]")
    near = difflib.get_close_matches(key, SCHEMA, n=1, cutoff=0.5)
    if not near:  # a known key in the wrong section, or a bare name: compare the last part
        tails = {k.split(".")[-1]: k for k in SCHEMA}
        match = difflib.get_close_matches(key.split(".")[-1], tails, n=1, cutoff=0.6)
        near = [tails[match[0]]] if match else []
    hint = f"; did you mean {near[0]!r}?" if near else f"; known keys: {', '.join(SCHEMA)}"
    return ConfigError(f"{where}: unknown key {key!r}{hint}")


def validate(raw: Mapping[str, Any], *, path: Path | None = None,
             sources: Mapping[str, str] | None = None) -> Config:
    """Check every dotted key of ``raw``; fill defaults. ``sources`` names where a key came from."""
    sources = dict(sources or {})
    where_default = str(path) if path else "config"
    values: dict[str, Any] = {}
    for key in raw:
        if key not in SCHEMA:
            raise _unknown(key, sources.get(key, where_default))
    for key, spec in SCHEMA.items():
        if key not in raw:
            values[key] = spec.default
            continue
        try:
            values[key] = spec.check(raw[key])
        except ValueError as exc:
            origin = sources.get(key, where_default)
            name = origin if origin.startswith("--") else f"{origin}: {key}"
            raise ConfigError(f"{name} {exc}") from None
    return Config(values=values, path=path, sources=sources)


def load_config(path: str | Path | None = None, overrides: Mapping[str, Any] | None = None,
                override_sources: Mapping[str, str] | None = None) -> Config:
    """Read ``path`` (TOML; None: defaults only), apply ``overrides`` (dotted keys, e.g. from CLI flags).

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
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"
    return str(v)


def example_config() -> str:
    """The commented example configuration ``edgetune init`` writes (every key, with its default)."""
    lines = [
        "# edgetune configuration: `edgetune search --config edgetune.toml` (flags override these keys).",
        "# Every key is optional except the budget (here or --budget). Commented keys show an example value.",
        "",
    ]
    section = ""
    for key, spec in SCHEMA.items():
        sec, _, name = key.rpartition(".")
        if sec != section:
            lines += ["", f"[{sec}]"]
            section = sec
        lines.append(f"# {spec.help}")
        if key == "power_budget_w":
            lines.append(f"{name} = {spec.example}")
        elif spec.default is None or spec.default == {} or spec.default == "" and spec.example:
            lines.append(f"# {name} = {spec.example}")
        else:
            lines.append(f"{name} = {_toml_value(spec.default)}")
    return "\n".join(lines) + "\n"
