"""The README's examples run as written: every command and every Python block, in order, in one folder.

Commands run through ``edgetune.cli.main`` in this process (the same code path as the console script,
without a Python start-up per command), with small sizes added so the whole README takes seconds: fewer
trials, shorter windows and a shorter thermal soak for ``search``, fewer steps for ``run``, a duration for
``monitor``. Hardware commands (``devices``, ``monitor``, ``restore``, ``--device jetson``) run against a fake
Jetson tree (``EDGETUNE_SYSFS_ROOT``); everything else sees an empty tree, so ``--device auto`` is the twin.
Commands that install software, need root or a container, or run the benchmarks are skipped, each for the
reason in :data:`SKIPPED`; a command that is neither run nor listed there fails the test, so the README cannot
gain an example that nobody runs.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from fakes.jetson_tree import build_jetson

from edgetune.cli import main

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"

#: commands not run here, by their first word(s), and why
SKIPPED = {
    "pip install": "installs packages (the test runs in the installed environment)",
    "python -m pytest": "the test suite itself",
    "sudo": "needs root on a real Jetson (the jtop service)",
    "docker run": "needs a container runtime and a Jetson host",
    "python experiments/": "benchmarks: minutes each; run by hand (README, Benchmarks)",
    "optuna-dashboard": "a web server",
}

#: sizes added to keep each command short (the README's own flags stay as written, later flags win)
FAST = {
    # a 30-s thermal soak, not 360: the soak's path still runs (its windows, fit and margin), at a twelfth of
    # the simulated steps, which were two thirds of this test's time
    "search": ["--n-trials", "6", "--batch-sizes", "8,16,32", "--measure-s", "0.5", "--warmup-steps", "0",
               "--real-steps", "0", "--soak-s", "30", "--quiet"],
    "run": ["--steps", "5", "--warmup", "1"],
    "monitor": ["--duration", "0.3"],
}
HARDWARE = ("devices", "monitor", "restore")  # commands that look at the machine's hardware


def blocks(text: str) -> list[tuple[str, str]]:
    """Every fenced code block of ``text`` as (language, body), in order."""
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.MULTILINE | re.DOTALL)]


def commands(body: str) -> list[str]:
    """The shell commands of a block: continuation lines joined, trailing comments dropped, ``&&`` split."""
    joined = re.sub(r"\\\n\s*", " ", body)
    out = []
    for line in joined.splitlines():
        line = re.split(r"\s+#", line, maxsplit=1)[0].strip()
        out += [part.strip() for part in line.split("&&") if part.strip()]
    return out


def readme_steps() -> list[tuple[str, str]]:
    steps = []
    for lang, body in blocks(README.read_text(encoding="utf-8")):
        if lang == "python":
            steps.append(("python", body))
        else:
            steps += [("shell", c) for c in commands(body)]
    return steps


def _skip_reason(command: str) -> str | None:
    return next((why for prefix, why in SKIPPED.items() if command.startswith(prefix)), None)


def test_the_readme_has_examples_of_each_kind():
    steps = readme_steps()
    assert sum(kind == "python" for kind, _ in steps) >= 1
    shell = [c for kind, c in steps if kind == "shell"]
    for sub in ("search", "run", "init", "devices", "monitor", "restore", "trace import-zeus", "predict-eval"):
        assert any(c.startswith(f"edgetune {sub}") for c in shell), sub


def test_every_readme_example_runs_as_written(tmp_path, monkeypatch, capsys):
    fake = build_jetson(tmp_path / "jetson", "orin-nano")
    empty = tmp_path / "no-hardware"
    empty.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    # data the trace and steps-to-target commands name by relative path, and the example workload
    for rel in ("experiments/data/zeus-nsdi23", "experiments/data/convergence", "examples"):
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).symlink_to(REPO / rel)
    monkeypatch.chdir(work)
    ran, skipped = [], []
    for kind, text in readme_steps():
        if kind == "python":
            monkeypatch.setenv("EDGETUNE_SYSFS_ROOT", str(empty))
            exec(compile(text, "README.md (python block)", "exec"), {"__name__": "__readme__"})  # noqa: S102
            ran.append("python block")
            continue
        why = _skip_reason(text)
        if why is not None:
            skipped.append(text)
            continue
        assert text.startswith("edgetune "), f"README command neither run nor skipped with a reason: {text}"
        argv = shlex.split(text)[1:]
        sub = argv[0]
        hardware = sub in HARDWARE or "jetson" in argv
        monkeypatch.setenv("EDGETUNE_SYSFS_ROOT", str(fake.root if hardware else empty))
        if sub == "search" and any(a.startswith("trace:") for a in argv):
            argv += ["--n-trials", "3", "--quiet"]
        else:
            argv += FAST.get(sub, [])
        if sub == "run":
            argv += ["--batch-size", "8"]  # a real training step on this CPU per step: a small one
        if "jetson" in argv and sub in ("search", "run"):
            argv += ["--torch-device", "cpu"]  # the fake board's GPU is the twin; this machine's torch has no CUDA
        code = main(argv)
        out = capsys.readouterr()
        assert code == 0, f"{text}\n{out.out}\n{out.err}"
        ran.append(text)
    assert len(ran) >= 12 and skipped  # the README's examples, minus the listed ones
    assert (work / "edgetune-out" / "sim-orin-nano-cnn-time-10W" / "best.json").is_file()
    assert (work / "edgetune-out" / "sim-orin-nano-cnn-energy-12W" / "best.json").is_file()


@pytest.mark.parametrize("command", ["pip install -e '.[jetson]'", "sudo usermod -aG jtop $USER"])
def test_skips_are_by_listed_reason_only(command):
    assert _skip_reason(command) is not None
    assert _skip_reason("edgetune search --budget 10") is None
