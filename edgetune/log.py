"""Logging for the library, the way Optuna does it: ``get_logger(__name__)`` under one ``edgetune`` root.

The library never prints; it logs. The command-line interface attaches a handler that writes the root
logger's records to standard error (:func:`enable_default_handler`); an application that embeds edgetune
configures logging as it likes, and by default sees warnings and above through Python's last-resort handler.
"""

from __future__ import annotations

import logging
import sys
import threading

__all__ = ["disable_default_handler", "enable_default_handler", "get_logger", "set_verbosity"]

_ROOT = "edgetune"
_lock = threading.Lock()
_default_handler: logging.Handler | None = None


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time of the record (tests and tools swap it)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self):  # logging's own attribute
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:  # set by StreamHandler.__init__
        pass


def get_logger(name: str) -> logging.Logger:
    """The logger for module ``name`` (pass ``__name__``), a child of the ``edgetune`` root logger."""
    if name != _ROOT and not name.startswith(_ROOT + "."):
        name = f"{_ROOT}.{name}"
    return logging.getLogger(name)


def enable_default_handler(level: int = logging.INFO) -> None:
    """Write edgetune's records to standard error, one line each (``edgetune: message``)."""
    global _default_handler
    with _lock:
        root = logging.getLogger(_ROOT)
        if _default_handler is None:
            _default_handler = _StderrHandler()
            _default_handler.setFormatter(logging.Formatter("edgetune: %(message)s"))
            root.addHandler(_default_handler)
            root.propagate = False
        root.setLevel(level)


def disable_default_handler() -> None:
    """Remove the handler :func:`enable_default_handler` attached."""
    global _default_handler
    with _lock:
        root = logging.getLogger(_ROOT)
        if _default_handler is not None:
            root.removeHandler(_default_handler)
            _default_handler = None
            root.propagate = True


def set_verbosity(level: int) -> None:
    """Level of the ``edgetune`` root logger (``logging.INFO``, ``logging.WARNING`` ...)."""
    logging.getLogger(_ROOT).setLevel(level)
