"""Run the edgetune CLI in a child process as a terminal would: Ctrl-C raises KeyboardInterrupt there.

A child inherits an ignored SIGINT from a background job (and so do the pytest workers of a CI run launched
in the background); Python then never raises KeyboardInterrupt and the child sleeps through the signal. The
child here restores the default handler and unblocks the signal before it runs ``python -m edgetune``.
"""

from __future__ import annotations

import sys

_CODE = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
         "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); sys.argv[0] = 'edgetune'; "
         "runpy.run_module('edgetune', run_name='__main__')")


def edgetune_argv(*args: str) -> list[str]:
    """The argv of ``python -m edgetune ARGS`` with SIGINT handled as in a terminal (module docs)."""
    return [sys.executable, "-c", _CODE, *args]
