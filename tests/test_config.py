"""The TOML config: every key validated with one line naming the key and the fix; CLI flags win."""

from __future__ import annotations

import re
from dataclasses import FrozenInstanceError, replace
from pathlib import Path

import pytest

from edgetune.cli import main
from edgetune.config import SCHEMA, Config, ConfigError, example_config, load_config, validate


def test_example_config_loads_back_with_every_default(tmp_path):
    path = tmp_path / "edgetune.toml"
    path.write_text(example_config())
    cfg = load_config(path)
    for key, spec in SCHEMA.items():
        expected = 10.0 if key == "power_budget_w" else spec.default
        assert spec.value_in(cfg) == expected, key
    # every key appears in the example (commented or not), so `edgetune init` documents all of them
    for key in SCHEMA:
        assert key.rpartition(".")[2] + " =" in example_config()


@pytest.mark.parametrize(("raw", "message"), [
    ({"search.n_trial": 5}, "unknown key 'search.n_trial'; did you mean 'search.n_trials'?"),
    ({"objectiv": "time"}, "did you mean 'objective'?"),
    ({"patience": 3}, "did you mean 'search.patience'?"),
    ({"gpu_freq": 1}, "knob values go in the [space] section"),
    ({"objective": "energi"}, ("objective must be one of time, energy, throughput, pareto, cost, got 'energi'; "
                              "did you mean 'energy'?")),
    ({"power_budget_w": -3}, "power_budget_w must be > 0, got -3"),
    ({"power_budget_w": "ten"}, "power_budget_w must be a number of watts, got 'ten'"),
    ({"search.n_trials": True}, "search.n_trials must be a whole number >= 1"),
    ({"space.batch_sizes": [32, 32]}, "lists a batch size twice"),
    ({"space.batch_sizes": [0, 8]}, "must hold whole numbers >= 1"),
    ({"budget.tolerance": 0.9}, "budget.tolerance must be <= 0.5"),
    ({"efficiency.b_noise": "lots"}, 'must be a number of samples > 0, "workload" or "measure"'),
    ({"efficiency.b_noise_warmups": 0}, "efficiency.b_noise_warmups must be >= 1, got 0"),
    ({"protocol.real_steps": -1}, "protocol.real_steps must be >= 0"),
    ({"space.values": {"gpu_freq": []}}, "gpu_freq must be a non-empty list"),
    # a key of a section written at the top, or a top-level key written below a [section] line
    ({"device": "x", "space.device": "sim:orin-agx"},
     "unknown key 'space.device'; device is a top-level key: move it above the first [section] line"),
    ({"search.power_budget_w": 10}, "in TOML every key below a [search] line belongs to [search]"),
    ({"search.batch_sizes": [8]}, "unknown key 'search.batch_sizes'; batch_sizes belongs in the [space] section"),
    ({"seed": 2**64}, "seed must be <= 2147483647, got 18446744073709551616"),
    ({"space.knobs": ["gpu_freq", "gpu_freq"]}, "space.knobs lists a knob twice: ['gpu_freq', 'gpu_freq']"),
])
def test_bad_keys_and_values_are_one_line_naming_the_key(raw, message):
    with pytest.raises(ConfigError) as info:
        validate(raw)
    text = str(info.value)
    assert message in text
    assert "\n" not in text


def test_values_are_normalised():
    cfg = validate({"objective": "Energy", "space.batch_sizes": [64, 16], "space.knobs": "all",
                    "protocol.real_steps": "all", "efficiency.b_noise": "measure"})
    assert cfg.objective == "energy"
    assert cfg.space.batch_sizes == (16, 64)
    assert cfg.space.knobs is None
    assert cfg.protocol.real_steps is None
    assert cfg.efficiency.b_noise == "measure"
    from edgetune.cli.search import measurement_protocol

    assert measurement_protocol(cfg.protocol).real_steps is None


def test_sections_and_flag_overrides(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('power_budget_w = 10.0\nobjective = "energy"\n[search]\nn_trials = 7\n'
                    '[space]\nbatch_sizes = [8, 16]\nvalues = { gpu_freq = ["max"] }\n')
    cfg = load_config(path, {"power_budget_w": 12.5, "search.n_trials": None}, {"power_budget_w": "--budget"})
    assert cfg.power_budget_w == 12.5  # the flag wins
    assert cfg.search.n_trials == 7  # an unset flag (None) leaves the file's value
    assert cfg.objective == "energy"
    assert cfg.space.values == {"gpu_freq": ("max",)}
    assert cfg.sources["power_budget_w"] == "--budget" and cfg.sources["search.n_trials"] == str(path)
    with pytest.raises(ConfigError, match=r"^--budget must be > 0, got -1$"):
        load_config(path, {"power_budget_w": -1}, {"power_budget_w": "--budget"})


def test_file_problems_are_one_line(tmp_path):
    with pytest.raises(ConfigError, match="does not exist; create one with `edgetune init"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("power_budget_w = = 3\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    section = tmp_path / "section.toml"
    section.write_text("search = 3\n")
    with pytest.raises(ConfigError, match=r"search = 3: \[search\] is a section \(keys n_trials, sampler, .*\), not a "
                                          r"value$"):
        load_config(section)
    # the budget in watts is power_budget_w: `budget = 7` was called a section without a word of the key meant
    section.write_text("budget = 7\n")
    with pytest.raises(ConfigError, match=r"budget = 7: \[budget\] is a section \(keys window_s, tolerance, guard_sigma\), "
                                          r"not a value; for power_budget_w, write power_budget_w = 7 above the first "
                                          r"\[section\] line$"):
        load_config(section)
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("[search]\nsampler = \"tpe\"\nstorge = \"sqlite:///x.db\"\n")
    with pytest.raises(ConfigError, match=rf"{unknown}: unknown key 'search.storge'; did you mean 'search.storage'"):
        load_config(unknown)


@pytest.mark.parametrize(("text", "message"), [
    ('power_budget_w = 10\n[Space]\nknobs = ["gpu_freq"]\n', "unknown section [Space]; did you mean [space]?"),
    ('power_budget_w = 10\n[spcae]\nbatch_sizes = [8]\n', "unknown section [spcae]; did you mean [space]?"),
    ('power_budget_w = 10\n[values]\ngpu_freq = ["max"]\n',
     "unknown section [values]; values is a key of the [space] section: values = ... below a [space] line"),
    ('power_budget_w = 10\n[limits]\nx = 1\n', "unknown section [limits]; the sections are [budget], [space], "),
])
def test_an_unknown_section_is_named_as_a_section(tmp_path, text, message):
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: {message}")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("argv", "key", "value"), [
    (["--batch-sizes", "16 32"], "space.batch_sizes", (16, 32)),  # a space is a separator, not nothing: not 1632
    (["--batch-sizes", "16, 32,64"], "space.batch_sizes", (16, 32, 64)),
    (["--knobs", "gpu_freq emc_freq"], "space.knobs", ("gpu_freq", "emc_freq")),
])
def test_list_flags_take_commas_or_spaces_between_items(argv, key, value):
    from edgetune.cli import build_parser
    from edgetune.cli.flags import config_from_args

    assert config_from_args(build_parser().parse_args(["search", *argv])).flat()[key] == value


@pytest.mark.parametrize(("argv", "message"), [
    (["--b-noise", "Measure"], ('argument --b-noise: expected a number of samples, "workload" or "measure", got '
                                "'Measure'")),
    (["--real-steps", "ALL"], "argument --real-steps: expected a whole number or \"all\", got 'ALL'"),
])
def test_a_flag_word_it_does_not_take_names_the_words_it_does(capsys, argv, message):
    with pytest.raises(SystemExit) as info:  # argparse's own refusal: it exits
        main(["search", "--budget", "10", *argv])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_storage_and_study_name_defaults(tmp_path):
    cfg = validate({"output": str(tmp_path / "out"), "power_budget_w": 9.5})
    assert cfg.storage_url() == f"sqlite:///{(tmp_path / 'out' / 'study.db').resolve()}"
    assert cfg.study_name("sim:orin-nano", "cnn") == "sim:orin-nano-cnn-9.5W-time"
    assert validate({"search.study_name": "fleet"}).study_name("x", "y") == "fleet"


def test_init_writes_the_example_and_refuses_to_overwrite(tmp_path, capsys):
    path = tmp_path / "sub" / "edgetune.toml"
    assert main(["init", str(path)]) == 0
    assert path.read_text() == example_config()
    assert main(["init", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"edgetune: error: {path} exists; pass --force to overwrite it, or give another path"
    assert main(["init", str(path), "--force"]) == 0


def test_search_reports_a_config_error_in_one_line_exit_2(tmp_path, capsys):
    path = tmp_path / "c.toml"
    path.write_text("power_budget_w = 10\n[search]\nn_trial = 3\n")
    assert main(["search", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"edgetune: error: {path}: unknown key 'search.n_trial'; did you mean 'search.n_trials'?"]
    assert main(["search", "--device", "sim:orin-nano"]) == 2
    assert "no power budget: pass --budget WATTS" in capsys.readouterr().err


def _search_flags() -> dict[str, str]:
    """``edgetune search``'s flags -> their help text, as argparse renders it (``%%`` -> ``%``)."""
    import argparse

    from edgetune.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {opt: (action.help or "").replace("%%", "%") for action in sub.choices["search"]._actions
            for opt in action.option_strings if opt.startswith("--")}


def _stated_default(help_text: str) -> str | None:
    stated = re.search(r"\(default (.+?)[;)]", help_text)
    return stated.group(1) if stated else None


def test_search_help_states_the_n_trials_default_the_search_uses():
    assert int(_stated_default(_search_flags()["--n-trials"])) == load_config().search.n_trials


def test_every_flag_states_the_default_the_config_loads_and_its_key():
    flags = _search_flags()
    defaults = load_config()  # no file, no flag: what a search runs with
    with_flag = [key for key in SCHEMA.values() if key.flag is not None]
    assert {k.flag.name for k in with_flag} <= set(flags)
    assert {k.name for k in with_flag} == set(SCHEMA) - {"space.values"}  # a table has no flag
    for key in with_flag:
        help_text = flags[key.flag.name]
        assert f"config: {key.name})" in help_text, key.name
        stated = _stated_default(help_text)
        if key.name == "power_budget_w":  # no default: the search asks for one
            assert stated is None
            continue
        assert stated is not None, f"{key.flag.name} states no default"
        if key.default_text is not None:  # a description ("all", "<device>-<workload>-...")
            assert stated == key.default_text
            continue
        # the stated default, read as the flag reads its text, is the value the config loads
        assert key.check(key.flag.parse(stated)) == key.value_in(defaults), key.name


@pytest.mark.parametrize(("argv", "key", "value"), [
    (["--device", "sim:orin-nx"], "device", "sim:orin-nx"),
    (["--workload", "mobilenet"], "workload", "mobilenet"),
    (["--budget", "7.5"], "power_budget_w", 7.5),
    (["--objective", "pareto"], "objective", "pareto"),
    (["-o", "out2"], "output", "out2"),
    (["--seed", "3"], "seed", 3),
    (["--window", "0.5"], "budget.window_s", 0.5),
    (["--tolerance", "0.02"], "budget.tolerance", 0.02),
    (["--guard-sigma", "1"], "budget.guard_sigma", 1.0),
    (["--batch-sizes", "64,16"], "space.batch_sizes", (16, 64)),
    (["--knobs", "gpu_freq,emc_freq"], "space.knobs", ("gpu_freq", "emc_freq")),
    (["--n-trials", "9"], "search.n_trials", 9),
    (["--sampler", "TPE"], "search.sampler", "tpe"),
    (["--storage", "journal:j.log"], "search.storage", "journal:j.log"),
    (["--study-name", "fleet"], "search.study_name", "fleet"),
    (["--patience", "0"], "search.patience", 0),
    (["--margin", "0.05"], "search.margin", 0.05),
    (["--timeout", "60"], "search.timeout_s", 60.0),
    (["--warmup-steps", "2"], "protocol.warmup_steps", 2),
    (["--measure-steps", "7"], "protocol.measure_steps", 7),
    (["--measure-s", "3"], "protocol.measure_s", 3.0),
    (["--real-steps", "all"], "protocol.real_steps", None),
    (["--s-min", "500"], "efficiency.s_min", 500.0),
    (["--b-noise", "measure"], "efficiency.b_noise", "measure"),
])
def test_each_flag_overrides_its_key_and_only_it(tmp_path, argv, key, value):
    from edgetune.cli import build_parser
    from edgetune.cli.flags import config_from_args

    path = tmp_path / "c.toml"
    path.write_text(example_config())
    args = build_parser().parse_args(["search", "--config", str(path), *argv])
    changed = config_from_args(args).flat()
    base = load_config(path).flat()
    assert changed[key] == value
    assert {k for k in changed if changed[k] != base[k]} == {key}
    assert config_from_args(args).sources[key] == SCHEMA[key].flag.name


def test_a_switch_a_file_turns_on_is_turned_off_by_its_no_flag(tmp_path):
    """``known_convergence = true`` in a shared file could not be turned off from the command line: the flag
    only set it."""
    from edgetune.cli import build_parser
    from edgetune.cli.flags import config_from_args

    path = tmp_path / "c.toml"
    path.write_text(example_config().replace("known_convergence = false", "known_convergence = true"))
    assert load_config(path).efficiency.known_convergence is True
    off = config_from_args(build_parser().parse_args(["search", "--config", str(path), "--no-known-convergence"]))
    assert off.efficiency.known_convergence is False and off.sources["efficiency.known_convergence"] == \
        "--no-known-convergence"
    on = config_from_args(build_parser().parse_args(["search", "--known-convergence"]))
    assert on.efficiency.known_convergence is True


def test_config_sections_are_typed_and_frozen():
    cfg = validate({"power_budget_w": 10})
    assert cfg.search.n_trials == SCHEMA["search.n_trials"].default
    assert cfg.protocol.warmup_steps == SCHEMA["protocol.warmup_steps"].default
    with pytest.raises(FrozenInstanceError):
        cfg.search.n_trials = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        cfg.space.values["gpu_freq"] = ("max",)  # type: ignore[index]
    assert Config() == validate({})  # the dataclass defaults are the schema's defaults
    for name, key in SCHEMA.items():  # every default passes its own check unchanged
        assert key.check(key.default) == key.default, name


def test_readme_and_help_name_one_default_sampler_and_what_auto_resolves_to():
    from edgetune.search.study import AUTO_SAMPLER

    default = load_config().search.sampler
    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    stated = re.search(r"`--sampler (\w+)`, the default", readme)
    assert stated is not None and stated.group(1) == default
    assert f"resolves to the measured winner, `{AUTO_SAMPLER}`" in readme
    sampler_help = _search_flags()["--sampler"]
    assert _stated_default(sampler_help) == default
    assert f"{default}: the measured winner, {AUTO_SAMPLER}" in sampler_help


def test_a_validated_config_validates_again_unchanged():
    cfg = validate({"power_budget_w": 10, "space.batch_sizes": [64, 16], "space.knobs": ["gpu_freq"],
                    "space.values": {"gpu_freq": ["max", 306_000_000]}, "protocol.real_steps": "all",
                    "efficiency.b_noise": "measure"})
    again = cfg.with_values(**{"search.n_trials": 5})
    assert again.search.n_trials == 5
    assert again == replace(cfg, search=replace(cfg.search, n_trials=5))
    assert validate(cfg.flat()) == cfg


def test_config_does_not_import_the_search():
    import ast

    import edgetune.config

    tree = ast.parse(Path(edgetune.config.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not [m for m in imported if m == "edgetune.search" or m.startswith("edgetune.search.")]


def test_every_registered_knob_named_as_a_key_points_to_the_space_section():
    from edgetune.power.knobs import KNOBS

    for name in KNOBS:
        for key in (name, f"space.{name}"):
            with pytest.raises(ConfigError, match=rf"knob values go in the \[space\] section: values = {{ {name} ="):
                validate({key: 1})
