"""Measurement tables: step time and power measured per knob setting (and batch size), as CSV.

A table is what a profiling run, a colleague's board or a published trace measured. The predictors learn
from tables, the ``trace:<table.csv>`` device replays them (:mod:`edgetune.power.trace`), and the search
reports its gap to a table's own oracle.

Table format v2
---------------
UTF-8 text (a leading byte-order mark, as Excel writes CSV, is skipped), comma-separated; a header with no
comma but semicolons or tabs sets that delimiter instead, and then numbers may use a decimal comma (``0,0516``,
as spreadsheets in many locales save CSV; a ``.`` in such a table is refused: it may be a thousands
separator). One header line. Lines starting
with ``#`` before it are notes (e.g. the source), except declarations:
``# edgetune: key=value, key=value`` (see below). Columns:

=========================  ===========  ===================================================================
column                     required     meaning
=========================  ===========  ===================================================================
``power_w``                yes          mean board/GPU power while training, W
``step_time_s``            one of the   seconds per training step at that setting
``time_per_epoch_s``       two          seconds per epoch (published traces report this)
``batch_size``             no           samples per step; without it the table is a fixed-batch sweep (one
                                        job, the batch size it ran at, declared or unknown)
``peak_power_w``           no           highest power seen, W
``epochs_to_target``       no           epochs to reach the quality target at this batch size (same value
                                        on every row of a batch size); ``inf`` = never reached; empty on
                                        every row of a batch size = no convergence data there
``convergence_runs``       no           training runs behind ``epochs_to_target`` (per batch size)
``convergence_failures``   no           of those, runs that never reached the target
``samples_per_epoch``      no           training set size; relates ``time_per_epoch_s`` and ``step_time_s``
``repeats``, ``time_cv``,  no           written by :func:`save_table` for aggregated repeats: how many, and
``power_cv``                            the relative spread (std / median) of time and power; empty = one
any other column           -            a knob (below)
=========================  ===========  ===================================================================

Reserved columns are matched ignoring case, with spaces or hyphens read as ``_`` (``Batch Size``,
``Power_W``). ``batch_size`` may also be ``bs``, ``batch`` or ``batchsize``. A measured time or power may
be given in another unit, named as a suffix or in brackets, and is converted: ``power_mw``, ``power (mW)``,
``Power [W]`` -> ``power_w`` (W); ``step_time_ms``, ``step_time (ms)``, ``_us`` -> ``step_time_s``;
``time_per_epoch (min)``, ``_ms``, ``_h`` -> ``time_per_epoch_s``; ``peak_power_mw``. The stems
``avg_power``/``mean_power``/``average_power``, ``time_per_step``/``iter_time`` and ``epoch_time`` are the
same columns. A measured time or power without a unit (``power``: W or mW?) is refused.

Knob columns are mapped to the registry's roles (:mod:`edgetune.power.knobs`: GPU clock, memory clock, CPU
clock, online cores, power limit, power mode) by name and unit suffix, and renamed to the registry's name
in its unit: ``gpu_freq_hz`` -> ``gpu_freq`` (Hz), ``emc_freq_mhz`` -> ``emc_freq`` (x1e6, Hz),
``cpu_freq_khz`` -> ``cpu_freq`` (kHz), ``cpu_cores``, ``power_limit_w``; aliases such as ``gpu_clk``,
``online_cores``, ``nvpmodel`` too (:mod:`edgetune.tables.columns`); a unit in brackets is the same suffix
(``gpu_freq (MHz)``, ``power_limit [W]``); case is ignored and spaces or hyphens count as ``_`` (``GPU freq
(MHz)``). Two columns of one role are refused
(keep one, or ignore one). Other columns are knobs with no role (the hardware model treats them
generically); a power-suffixed column that is not a power limit is refused, and so is a column whose name
says it is a measurement or an index rather than a setting (``throughput``, ``samples/s``, ``time_ms``,
``Temp GPU``, ``GPU util (%)``, ``Power TOT``, ``run``, ``seed``; jtop's bare ``GPU``/``EMC``/``CPU1``, loads):
drop it with ``column <header>=ignore``, or map it to what it is. Power modes are nvpmodel mode
numbers. Every value is a finite number (except the empty and ``inf`` cases above, and out of memory below). A value its column's unit
makes impossible is refused, naming the unit to give: a clock outside 10 MHz - 100 GHz (``GR3D_FREQ`` in MHz
is an alias of ``gpu_freq``, in Hz: name it ``gpu_freq_mhz``), a power or power limit over 2000 W (milliwatts
in ``power_w``: name it ``power_mw``; a machine that draws more gives its power in kilowatts, ``power_kw``).

A row whose step time, time per epoch or power says the setting ran out of memory (``OOM``, ``CUDA OOM``,
``out of memory``, any case; the other measured cells are then ignored, and may be empty), as sweep scripts
write for a batch size that did not fit, measured nothing: it is no row, and the table keeps the setting in
:attr:`Table.out_of_memory`, which a replay answers out of memory. A setting with a repeat that ran is
measured (its out-of-memory lines are noted and dropped); a table of nothing but such rows is refused.

Repeated rows (the same setting and batch size several times) are measurements of one setting: they are
aggregated into one row, every measured column the median of the repeats, ``repeats`` their count and
``time_cv`` / ``power_cv`` their spread, which a replay draws its noise from.

Declarations (``# edgetune:`` lines; several items per line separated by commas):

* ``default_batch_size=<B>``: the batch size the job runs at untuned (the baseline a search reports against);
  in a table without ``batch_size``, the batch size of every row. ``import-zeus`` writes Zeus's defaults.
* ``column <header>=<name>``: map a column by name (``column GR3D_MHz=gpu_freq_mhz``, ``column
  clk=gpu_clock``), rename it to a reserved column, in a unit where it has one (``column avg_w=power_w``,
  ``column VDD_IN=power_mw``, ``column time_ms=step_time_ms``), or drop it (``=ignore``).
* ``sensor_period_s=<s>``: update period of the power sensor that measured the table.
* ``default_time_cv=<r>``, ``default_power_cv=<r>``: relative spread of one measurement for rows without
  repeats (default: the table's repeated rows, else :data:`DEFAULT_TIME_CV` and :data:`DEFAULT_POWER_CV`).

A bad table raises :class:`TableError` with one line naming the file, the row and the fix; nothing is
ever fitted on a table that did not validate.

This package is data only: it imports from edgetune only the knob registry (:mod:`edgetune.power.knobs`)
and the logger.
"""

from edgetune.tables.columns import ALIASES, UNIT_SUFFIXES, KnobColumn, resolve_knob_name
from edgetune.tables.csvio import load_table, save_table
from edgetune.tables.table import (
    DEFAULT_POWER_CV,
    DEFAULT_TIME_CV,
    RESERVED_COLUMNS,
    Declarations,
    Spread,
    Table,
    TableError,
    check_train_size,
)

__all__ = [
    "ALIASES",
    "DEFAULT_POWER_CV",
    "DEFAULT_TIME_CV",
    "RESERVED_COLUMNS",
    "UNIT_SUFFIXES",
    "Declarations",
    "KnobColumn",
    "Spread",
    "Table",
    "TableError",
    "check_train_size",
    "load_table",
    "resolve_knob_name",
    "save_table",
]
