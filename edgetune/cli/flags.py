"""The config's command-line flags, generated from the one schema (:data:`edgetune.config.SCHEMA`).

Every key with a :class:`~edgetune.config.Flag` becomes one flag of ``edgetune search``: name, metavar and
help group from the flag; the help from the key's help line, with the schema's default and the key the
flag overrides (``(default 40; config: search.n_trials)``). Help and behaviour therefore cannot drift apart:
there is no second list of flags or defaults. A flag given on the command line overrides the key from the
config file; a flag left out leaves the file's value, or the schema's default.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from edgetune.cli import UsageError
from edgetune.config import SCHEMA, Config, ConfigError, Key, load_config

__all__ = ["add_config_flags", "config_from_args", "flag_help"]


def flag_help(key: Key, *, name_key: bool = True) -> str:
    """``key``'s help for argparse: its help line, its default, and (``name_key``) the config key."""
    notes = [] if key.stated_default is None else [f"default {key.stated_default}"]
    if name_key:
        notes.append(f"config: {key.name}")
    text = f"{key.help} ({'; '.join(notes)})" if notes else key.help
    return text.replace("%", "%%")  # argparse formats help with %


def _argument_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse`` as an argparse type: its ValueError message becomes argparse's one-line error."""
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    convert.__name__ = parse.__name__
    return convert


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """Add a flag for every schema key that has one (default None: "not given"), in help groups."""
    groups: dict[str | None, Any] = {None: parser}
    for key in SCHEMA.values():
        flag = key.flag
        if flag is None:
            continue
        if flag.group not in groups:
            groups[flag.group] = parser.add_argument_group(flag.group)
        if flag.switch:  # no value: --name sets the key to true, --no-name to false (over a file's true)
            groups[flag.group].add_argument(*flag.option_strings, dest=flag.dest,
                                            action=argparse.BooleanOptionalAction, default=None, help=flag_help(key))
            continue
        groups[flag.group].add_argument(*flag.option_strings, dest=flag.dest, type=_argument_type(flag.parse),
                                        metavar=flag.metavar, default=None, help=flag_help(key))


def config_from_args(args: argparse.Namespace) -> Config:
    """The config file ``args.config`` (if any) with the flags given on top, validated.

    Raises:
        UsageError: a bad file, key or value, in one line naming the flag or the key.
    """
    overrides: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for key in SCHEMA.values():
        if key.flag is None:
            continue
        value = getattr(args, key.flag.dest, None)
        if value is not None:
            overrides[key.name] = value
            # a switch turned off names the flag given: --no-known-convergence
            sources[key.name] = (f"--no-{key.flag.name[2:]}" if key.flag.switch and value is False
                                 else key.flag.name)
    try:
        return load_config(getattr(args, "config", None), overrides, sources)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
