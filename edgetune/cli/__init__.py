"""The ``edgetune`` command.

Each subcommand lives in its own module under ``edgetune.cli`` and offers ``register(subparsers)``, which
adds its parser and sets ``func`` (``func(args) -> int``, the exit code). Errors a user can fix are
raised as :class:`UsageError` (or the hardware layer's :class:`~edgetune.power.DeviceError`) and printed
as one line, exit code 2: never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from edgetune import __version__

# subcommand modules, in the order `edgetune --help` lists them
SUBCOMMAND_MODULES = (
    "edgetune.cli.search",
    "edgetune.cli.run",
    "edgetune.cli.hardware",
    "edgetune.cli.trace",
    "edgetune.cli.config_cmd",
)

EXIT_USAGE = 2  # bad input a user can fix (argparse's own code for usage errors)
#: the parsed arguments' name -> parser of each command, so an argument no command takes is named by its own
COMMAND_PARSERS = "_command_parsers"
EXIT_INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT, as a shell reports a command the signal ended
EXIT_TERMINATED = 143  # SIGTERM: 128 + SIGTERM, likewise
#: what a command prints from a simulated device (the twin, trace replay) starts with, so no figure is taken
#: for a measurement
SIMULATION_LABEL = "SIMULATION: "


def simulation_label(simulated: bool) -> str:
    """:data:`SIMULATION_LABEL` for a simulated device's output, else nothing."""
    return SIMULATION_LABEL if simulated else ""


class UsageError(Exception):
    """Bad input a user can fix: printed as ``edgetune: error: <message>``, exit code 2."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, with what was kept and how to go on: printed as ``edgetune: interrupted: <message>``."""


class Terminated(Interrupted):
    """SIGTERM (``systemctl stop``, ``docker stop``, a job scheduler's stop or time limit), raised in the main thread
    as Ctrl-C's KeyboardInterrupt is, so a command unwinds the same way: knobs restored, what was measured
    written. Printed as ``edgetune: terminated (SIGTERM): <message>``, exit code 143."""


@contextlib.contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """While a command runs, SIGTERM raises :class:`Terminated` (once: a second one while it unwinds is ignored, so
    the restores and the files it writes finish; a SIGKILL after a grace period still ends it). Left alone where
    SIGTERM has a handler of its embedding program, or is ignored, or off the main thread."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return

    def _raise(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated

    signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGTERM) in (_raise, signal.SIG_IGN):  # ours (the knobs' handler is gone by now)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, like every other bad input
        self.exit(EXIT_USAGE, f"edgetune: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="edgetune",
        description="Energy-aware training autotuner: co-selects batch size and DVFS knobs under a power budget.",
    )
    parser.add_argument("--version", action="version", version=f"edgetune {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # subcommand not part of this build
                continue
            raise
        module.register(subparsers)
    parser.set_defaults(**{COMMAND_PARSERS: dict(subparsers.choices)})
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from edgetune.power.base import DeviceError

    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # named by the command's own parser: its --help lists what it takes, not the top level's
        command = getattr(args, COMMAND_PARSERS, {}).get(getattr(args, "command", None), parser)
        command.error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    with _library_log_to_stderr(), _sigterm_unwinds():
        if args.command != "restore":  # `edgetune restore` does this itself, and says when there is nothing
            _recover_knobs()
        try:
            code = int(args.func(args) or 0)
            sys.stdout.flush()  # a closed pipe fails here, not in the interpreter's flush at exit
            return code
        except (UsageError, DeviceError) as exc:
            print(f"edgetune: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except KeyboardInterrupt as exc:
            detail = f": {exc}" if isinstance(exc, Interrupted) and str(exc) else ""
            terminated = isinstance(exc, Terminated)
            print(f"edgetune: {'terminated (SIGTERM)' if terminated else 'interrupted'}{detail}", file=sys.stderr)
            return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
        except BrokenPipeError:
            return _broken_pipe()


def _broken_pipe() -> int:
    """Standard output was closed early (``edgetune devices --json | head -1``): one line, exit 2.

    Python would print a traceback, and another one when it flushes standard output at exit; standard
    output is pointed at /dev/null so that final flush has nowhere to fail.
    """
    import os

    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    with contextlib.suppress(OSError, ValueError):
        print("edgetune: error: standard output was closed before the output was written (broken pipe)",
              file=sys.stderr)
    return EXIT_USAGE


@contextlib.contextmanager
def _library_log_to_stderr() -> Iterator[None]:
    """The library's log records as ``edgetune: ...`` lines on stderr while a command runs.

    :func:`edgetune.log.enable_default_handler`; afterwards the ``edgetune`` logger is put back as it was
    (a program or a test that calls :func:`main` keeps its own logging set-up).
    """
    from edgetune.log import disable_default_handler, enable_default_handler

    root = logging.getLogger("edgetune")
    handlers, level = list(root.handlers), root.level
    enable_default_handler()
    try:
        yield
    finally:
        if root.handlers != handlers:  # the handler is ours: remove it
            disable_default_handler()
        root.setLevel(level)


def _recover_knobs() -> None:
    """Restore knobs a killed run (kill -9, power cut) left changed; never stops the command itself."""
    try:
        from edgetune.power.state import recover

        recover()
    except Exception as exc:  # noqa: BLE001 - recovery trouble is reported, the user's command still runs
        print(f"edgetune: warning: could not check for knobs left changed by an earlier run: {exc}",
              file=sys.stderr)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
