"""``edgetune init [PATH]``: write a commented example configuration (every key, with its default).

    edgetune init                 # writes edgetune.toml
    edgetune init my-board.toml   # then: edgetune search --config my-board.toml
"""

from __future__ import annotations

import argparse
from pathlib import Path

from edgetune.cli import UsageError

__all__ = ["register"]


def register(subparsers) -> None:
    p = subparsers.add_parser("init", help="write a commented example config file", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", nargs="?", default="edgetune.toml", help="where to write it (default edgetune.toml)")
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    p.set_defaults(func=init)


def init(args: argparse.Namespace) -> int:
    from edgetune.config import example_config

    path = Path(args.path)
    if path.is_dir():
        path = path / "edgetune.toml"
    if path.exists() and not args.force:
        raise UsageError(f"{path} exists; pass --force to overwrite it, or give another path")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(example_config(), encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None
    print(f"wrote {path}; edit it, then: edgetune search --config {path}")
    return 0
