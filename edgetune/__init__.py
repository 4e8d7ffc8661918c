"""edgetune: energy-aware training autotuner for power-limited edge devices.

Co-selects batch size and DVFS knobs (GPU, memory and CPU frequency, online cores, power mode, power
limit) under a hard power budget, measuring on the device itself. Where no power hardware is present,
the embedded default is a simulated Jetson (``sim:<profile>``), always labelled a simulation.
"""

__version__ = "0.1.0"

__all__ = ["Target", "__version__", "tune"]


def __getattr__(name: str):
    # `edgetune.tune` is imported on first use, so `import edgetune` stays light (no torch import)
    if name == "tune":
        from edgetune.runtime.api import tune

        return tune
    if name == "Target":
        from edgetune.runtime.target import Target

        return Target
    raise AttributeError(f"module 'edgetune' has no attribute {name!r}")
