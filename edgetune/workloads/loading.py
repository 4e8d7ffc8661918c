"""Loading a workload from its spec: a built-in name, or ``module:function`` naming the user's own.

``module`` is a dotted module importable from the current directory, PYTHONPATH or site-packages, or a
``path/to/file.py`` (the modules beside the file import while it loads, as under ``python path/to/file.py``,
and ``sys.argv`` holds no arguments, so a script that parses its command line at import takes its defaults).
Every failure (an unknown name, a module that does not import, a missing function, a
function that fails or returns no :class:`~edgetune.workloads.Workload`) is one :class:`WorkloadError` line.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

from edgetune.log import get_logger
from edgetune.workloads.core import RUN_SEED, Workload, WorkloadError, _one_line
from edgetune.workloads.models import _BUILDERS, BUILTIN_WORKLOADS

__all__ = ["load_workload"]

_log = get_logger(__name__)


def load_workload(spec: str, *, seed: int = 0) -> Workload:
    """The workload named by ``spec``, its weights and batches seeded by ``seed``.

    ``spec`` is a built-in name (:data:`BUILTIN_WORKLOADS`) or ``module:function`` (``package.module``
    importable from the current directory, PYTHONPATH or site-packages, or a ``path/to/file.py``) naming a
    function that returns a :class:`Workload`; the function receives ``seed=`` if it accepts it.

    Raises:
        WorkloadError: one line: an unknown name (with the nearest built-in), a module that does not import
            (with the import error) or exits as it does, a missing function, a function that needs arguments
            other than ``seed``, fails, exits or returns no Workload.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise WorkloadError(f"workload spec must be a name or module:function, got {spec!r}; "
                            f"built-in workloads: {', '.join(BUILTIN_WORKLOADS)}")
    spec = spec.strip()
    if ":" not in spec:
        builder = _BUILDERS.get(spec.lower())
        if builder is None:
            close = difflib.get_close_matches(spec.lower(), BUILTIN_WORKLOADS, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise WorkloadError(f"unknown workload {spec!r}; {hint}built-in workloads: "
                                f"{', '.join(BUILTIN_WORKLOADS)}; or give module:function for your own model")
        with _seeded(seed):
            return builder(seed)
    workload = _load_user_workload(spec, seed)
    _log.debug("loaded workload %r from %r (seed %d)", workload.name, spec, seed)
    return workload


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """Seed torch's global generator for model initialisation without disturbing the caller's stream, and make
    ``seed`` the default of the workloads built meanwhile (:data:`~edgetune.workloads.core.RUN_SEED`)."""
    token = RUN_SEED.set(seed)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            yield
    finally:
        RUN_SEED.reset(token)


@contextlib.contextmanager
def _own_argv(module_name: str) -> Iterator[None]:
    """``sys.argv`` as ``python path/to/file.py`` gives it, with no arguments, while the user's module loads and
    builds: a training script that parses its command line at import (argparse) takes its defaults rather than
    edgetune's flags."""
    argv = sys.argv
    sys.argv = [module_name]
    try:
        yield
    finally:
        sys.argv = argv


@contextlib.contextmanager
def _cwd_on_path(module_name: str = "") -> Iterator[None]:
    """Make modules in the current directory importable, as ``python -m`` does (console scripts don't), and,
    for a ``path/to/file.py``, those beside the file, as ``python path/to/file.py`` does (its ``from model
    import Net``)."""
    folders = [os.getcwd()]
    if module_name.endswith(".py"):
        folders.insert(0, os.path.dirname(os.path.abspath(module_name)))
    added = [f for f in dict.fromkeys(folders) if f not in sys.path and not (f == os.getcwd() and "" in sys.path)]
    sys.path[:0] = added
    try:
        yield
    finally:
        for folder in added:
            with contextlib.suppress(ValueError):
                sys.path.remove(folder)


def _import(module_name: str, spec: str) -> Any:
    try:
        if module_name.endswith(".py"):
            if not os.path.isfile(module_name):
                raise FileNotFoundError(f"no such file {module_name!r}")
            name = "edgetune_user_" + os.path.splitext(os.path.basename(module_name))[0]
            file_spec = importlib.util.spec_from_file_location(name, module_name)
            assert file_spec is not None and file_spec.loader is not None
            module = importlib.util.module_from_spec(file_spec)
            sys.modules[name] = module
            try:
                file_spec.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(name, None)
                raise
            return module
        return importlib.import_module(module_name)
    except Exception as exc:
        # the spec's own module (or a package above it) not found, rather than one of its imports
        own = isinstance(exc, ModuleNotFoundError) and (exc.name or "") in _packages(module_name)
        hint = ("; run edgetune from the folder that holds it, add that folder to PYTHONPATH, or give "
                "path/to/file.py:function") if own else ""
        raise WorkloadError(f"cannot import {module_name!r} for workload {spec!r}: {_one_line(exc)}{hint}") from exc
    except SystemExit as exc:
        raise WorkloadError(f"importing {module_name!r} for workload {spec!r} exited ({_exit(exc)}): it runs code "
                            f"at import; put that under if __name__ == '__main__':") from exc


def _load_user_workload(spec: str, seed: int) -> Workload:
    module_name, _, func_name = spec.rpartition(":")
    if not module_name or not func_name or not func_name.isidentifier():
        raise WorkloadError(f"workload spec {spec!r} is not module:function (e.g. my_package.models:build)")
    with _cwd_on_path(module_name), _own_argv(module_name):
        module = _import(module_name, spec)
        func = getattr(module, func_name, None)
        if func is None:
            functions = sorted(n for n, v in vars(module).items()
                               if inspect.isfunction(v) and not n.startswith("_") and v.__module__ == module.__name__)
            close = difflib.get_close_matches(func_name, functions, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise WorkloadError(f"module {module_name!r} has no function {func_name!r}; {hint}"
                                f"functions there: {', '.join(functions) or 'none'}")
        if not callable(func):
            raise WorkloadError(f"{spec!r} names a {type(func).__name__}, not a function returning a Workload")
        kwargs = {"seed": seed} if _accepts_seed(func) else {}
        needed = _required(func) - set(kwargs)
        if needed:
            raise WorkloadError(f"{spec!r} needs {', '.join(sorted(needed))}, which edgetune cannot give (it passes "
                                f"seed= only): give it a default, or name a function that calls it with yours")
        try:
            with _seeded(seed):
                result = func(**kwargs)
        except WorkloadError as exc:
            raise WorkloadError(f"workload {spec!r}: {exc}") from exc
        except Exception as exc:
            raise WorkloadError(f"workload function {spec!r} failed: {_one_line(exc)}") from exc
        except SystemExit as exc:
            raise WorkloadError(f"workload function {spec!r} exited ({_exit(exc)}); return a Workload, or raise "
                                f"an exception that says what is wrong") from exc
    if not isinstance(result, Workload):
        raise WorkloadError(f"{spec!r} returned {type(result).__name__}, not a Workload; build one with "
                            f"edgetune.workloads.Workload.from_model(name, model, make_batch, ...)")
    return result


def _packages(module_name: str) -> set[str]:
    """``a.b.c`` and the packages above it: ``a``, ``a.b``, ``a.b.c``."""
    parts = module_name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)}


def _exit(exc: SystemExit) -> str:
    return f"SystemExit: {' '.join(str(exc.code).split())}" if exc.code is not None else "SystemExit"


def _required(func: Callable[..., Any]) -> set[str]:
    """The parameters of ``func`` without a default (none where its signature cannot be read)."""
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return set()
    return {p.name for p in params if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def _accepts_seed(func: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "seed" and p.kind is not p.POSITIONAL_ONLY or p.kind is p.VAR_KEYWORD for p in params)
