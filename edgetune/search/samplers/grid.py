"""A search space by flat grid index: levels, the settings as they run, power modes, neighbours.

:class:`Grid` numbers every setting of a :class:`~edgetune.search.space.SearchSpace` (batch size first, then
each knob in order) and answers what the guided sampler asks of the space without a model: which grid points
are candidates, which power mode (named-knob group) a point is in, what it runs at, its neighbours, and what
the measured powers imply of the others (board power does not fall as the batch or a numeric knob rises in
one power mode).

Where the space knows what each power mode caps (:attr:`SearchSpace.mode_caps`), a point is taken as it runs:
a clock set at or above its mode's cap is that cap, and a setting two modes of the same fixed state run alike
(within both modes' caps) is one candidate, in the highest mode that runs it (:meth:`Grid.canonical`). So a
mode all of whose settings another mode runs too (Orin NX 10W inside 15W) has no candidates of its own.

Everything here is pure: no study, no model, no randomness.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from edgetune.power.knobs import KNOBS
from edgetune.search.space import SearchSpace

__all__ = ["Grid"]

_BATCH_STEPS = (-2, -1, 1, 2)  # neighbour levels in batch size: the optimum moves by octaves, two either way
_KNOB_STEPS = (-1, 1)  # neighbour levels in a knob


class Grid:
    """The settings of ``space`` by flat index (batch size first, then the knobs in order).

    Attributes:
        names: Optuna parameter names, one per level dimension.
        sizes: levels per dimension.
        n: grid points in all.
        tables: per dimension, the number each level stands for (named values, i.e. power modes, by rank).
        named: knob positions (0-based, in ``space.knobs``) that group the space: a power mode (a knob whose
            role caps the others) or any other named knob.
        numeric_names: the knobs that are not named (the hardware model's features within one group).
        pooled_names: every knob (the pooled model's features: modes as ranks).
        numeric_dims: level dimensions (batch size first) in which board power does not fall as the level
            rises within one group.
        allowed: on a rows space (a table replay), the flat indices of its rows; None on a full grid.
        mode_dim: the power mode's level dimension (None: no caps known).
    """

    def __init__(self, space: SearchSpace) -> None:
        self.space = space
        self.names = list(space.param_names())
        self.sizes = tuple([len(space.batch_sizes)] + [len(v) for _, v in space.knobs])
        self.n = int(np.prod(self.sizes))
        knob_names = list(space.knob_names)
        self.tables = [np.array(space.batch_sizes, dtype=float)] + [
            np.array([float(v) if not isinstance(v, str) else float(i + 1) for i, v in enumerate(values)])
            for _, values in space.knobs]
        self.named = [j for j, (name, v) in enumerate(space.knobs)
                      if isinstance(v[0], str) or (name in KNOBS and KNOBS[name].role.caps_others)]
        self.pooled_names = knob_names
        self.numeric_names = [n for j, n in enumerate(knob_names) if j not in self.named]
        self.numeric_dims = [0] + [j + 1 for j in range(len(space.knobs)) if j not in self.named]
        self.allowed = (None if space.rows is None else
                        np.unique(np.ravel_multi_index(tuple(space.row_levels.T), self.sizes)))
        self.mode_dim, self._peers, self._clamps, self._as_set = self._caps_maps()
        # per level dimension some level of which runs below its value: each mode's cap on it (inf: none)
        mode_caps = dict(space.mode_caps)
        self._run_caps = {d: np.array([float(mode_caps[m].cap(space.knobs[d - 1][0]) or np.inf)
                                       for m in space.knobs[self.mode_dim - 1][1]]) for d in self._as_set}
        self._candidates: np.ndarray | None = None
        self._groups: np.ndarray | None = None
        self._kin_of: dict[int, tuple[int, ...]] = {}

    # -- flat index and levels ------------------------------------------------------------------------
    def levels(self, idx: np.ndarray) -> np.ndarray:
        """(k, dims) levels of flat grid indices (batch size first)."""
        return np.stack(np.unravel_index(np.asarray(idx, dtype=np.int64), self.sizes), axis=1)

    def flat(self, levels: np.ndarray) -> np.ndarray:
        """Flat grid indices of (k, dims) levels."""
        return np.ravel_multi_index(tuple(np.asarray(levels).T), self.sizes)

    def index(self, params: dict[str, Any]) -> int:
        """Flat index of Optuna params, as the setting runs (:meth:`canonical`)."""
        return int(self.canonical(self.flat(np.array([[int(params[n]) for n in self.names]])))[0])

    def params(self, i: int) -> dict[str, int]:
        """Optuna params (a level per dimension) of flat index ``i``."""
        lv = self.levels(np.array([i]))[0]
        return {name: int(lv[j]) for j, name in enumerate(self.names)}

    def rows(self, idx: np.ndarray, names: list[str]) -> list[dict[str, float]]:
        """Hardware-model rows (knob values and batch size) of grid indices, for the knobs in ``names``: a
        level above its mode's cap at the cap."""
        lv = self.levels(idx)
        cols = {"batch_size": self.tables[0][lv[:, 0]]}
        for j, n in enumerate(self.space.knob_names):
            if n in names:
                cols[n] = self.tables[j + 1][lv[:, j + 1]]
                if j + 1 in self._as_set:  # a level above its mode's cap runs at the cap
                    cols[n] = np.minimum(cols[n], self._run_caps[j + 1][lv[:, self.mode_dim]])
        keys = list(cols)
        arrays = [cols[k].tolist() for k in keys]
        return [dict(zip(keys, vals)) for vals in zip(*arrays)]

    def group(self, idx: np.ndarray) -> np.ndarray:
        """Group id (the combination of named-knob levels) of grid indices; 0 where there are none."""
        lv = self.levels(idx)
        g = np.zeros(lv.shape[0], dtype=np.int64)
        for j in self.named:
            g = g * self.sizes[j + 1] + lv[:, j + 1]
        return g

    # -- the candidates, as they run ------------------------------------------------------------------
    def candidates(self) -> np.ndarray:
        """Flat indices of every candidate: the grid, or a rows space's rows; with the power modes' caps
        known, only settings as they run (:meth:`canonical`)."""
        if self._candidates is None:
            every = np.arange(self.n) if self.allowed is None else self.allowed
            self._candidates = every[self.canonical(every) == every] if self.mode_dim is not None else every
        return self._candidates

    def _caps_maps(self) -> tuple[int | None, np.ndarray, dict[int, np.ndarray], dict[int, np.ndarray]]:
        """What the space's power-mode caps make equal (:attr:`SearchSpace.mode_caps`).

        Returns the power mode's level dimension (None: no caps known); per pair of modes whether the second
        can run what the first runs (:meth:`ModeCaps.peer`: the same fixed state, the same caps on knobs
        not tuned); per capped level dimension a (modes, levels) table of the level each level runs at (a
        knob set at or above its mode's cap runs at the cap, so every level from the cap up is its lowest
        such level); and per capped level dimension a (modes, levels) table of whether the level runs at
        its own value under the mode (below the cap, or at a cap that is that level's value).
        """
        caps = dict(self.space.mode_caps)
        j_mode = next((j for j, (name, values) in enumerate(self.space.knobs)
                       if name in KNOBS and KNOBS[name].role.caps_others and all(v in caps for v in values)), None)
        if j_mode is None:
            return None, np.zeros((0, 0), dtype=bool), {}, {}
        modes = [caps[v] for v in self.space.knobs[j_mode][1]]
        tuned = self.space.knob_names
        clamps: dict[int, np.ndarray] = {}
        as_set: dict[int, np.ndarray] = {}
        for j, (name, values) in enumerate(self.space.knobs):
            if j == j_mode or isinstance(values[0], str):
                continue
            table = np.tile(np.arange(len(values)), (len(modes), 1))
            exact = np.ones((len(modes), len(values)), dtype=bool)
            for m, mode in enumerate(modes):
                first = mode.capped_from(name, values)
                if first is not None:
                    table[m, first:] = first
                    exact[m, first:] = False
                    exact[m, first] = float(values[first]) == float(mode.cap(name))
            if np.any(table != np.arange(len(values))):
                clamps[j + 1] = table
            if not exact.all():  # some level runs below its value: above a cap, or at one between two levels
                as_set[j + 1] = exact
        peers = np.array([[a.peer(b, tuned) for b in modes] for a in modes], dtype=bool)
        return j_mode + 1, peers, clamps, as_set

    def canonical(self, idx: np.ndarray) -> np.ndarray:
        """Flat indices of the settings as they run: each capped level at its mode's cap at most, and the
        mode the highest one that runs that setting the same (:meth:`_caps_maps`): a setting within the caps
        of two modes of the same fixed state runs alike under both, so it is one candidate, not two (Xavier
        NX's 10W desktop and 20W 2-core modes at the lowest clocks and one core; its nine modes hold three
        of their own, and many settings of those three run under another as well)."""
        idx = np.asarray(idx, dtype=np.int64)
        if self.mode_dim is None or idx.size == 0:
            return idx
        lv = self.levels(idx)
        mode = lv[:, self.mode_dim].copy()
        for d, table in self._clamps.items():
            lv[:, d] = table[mode, lv[:, d]]
        settled = ~self._as_set_under(lv, mode)  # at a cap between two levels: only its own mode runs it so
        out = mode.copy()
        for other in range(len(self._peers) - 1, -1, -1):
            hit = ~settled & self._peers[mode, other] & self._as_set_under(lv, np.full(len(lv), other))
            out[hit] = other
            settled |= hit
        lv[:, self.mode_dim] = out
        return self.flat(lv)

    def _as_set_under(self, lv: np.ndarray, modes: np.ndarray) -> np.ndarray:
        """Whether each row of levels ``lv`` runs at its own values under the power mode (level) beside it: no
        cap of that mode below any of them (a level set at a cap that lies below its value runs at the cap;
        :meth:`_caps_maps`)."""
        ok = np.ones(len(lv), dtype=bool)
        for d, exact in self._as_set.items():
            ok &= exact[modes, lv[:, d]]
        return ok

    def runs_under(self, la: np.ndarray, lb: np.ndarray) -> np.ndarray:
        """Whether each setting of levels ``la`` runs alike under the power mode of the setting of levels
        ``lb`` beside it: a peer mode (:meth:`ModeCaps.peer`) whose caps leave each of its levels as set,
        every other named knob the same. False everywhere without known caps."""
        if self.mode_dim is None:
            return np.zeros(len(la), dtype=bool)
        mb = lb[:, self.mode_dim]
        ok = self._peers[la[:, self.mode_dim], mb] & self._as_set_under(la, mb)
        for j in self.named:
            if j + 1 != self.mode_dim:
                ok &= la[:, j + 1] == lb[:, j + 1]
        return ok

    # -- power modes ----------------------------------------------------------------------------------
    def live_groups(self) -> np.ndarray:
        """The named-knob groups (power modes) that have candidates of their own."""
        if self._groups is None:
            self._groups = np.unique(self.group(self.candidates()))
        return self._groups

    def kin(self, group: int) -> tuple[int, ...]:
        """The groups (power modes) whose measurements are of the same physics as ``group``'s, itself
        included: modes of the same fixed state (:meth:`ModeCaps.peer`: the same GPU units, the same caps on
        knobs not tuned) with every other named knob alike run a setting within both modes' caps alike, so
        they differ only in how far their clocks go. Only ``group`` itself without known caps."""
        if self.mode_dim is None or not self.named:
            return (group,)
        if group not in self._kin_of:
            radix = [self.sizes[j + 1] for j in self.named]
            at = self.named.index(self.mode_dim - 1)
            mine = np.unravel_index(group, radix)

            def alike(g: int) -> bool:  # a peer mode (every mode is its own), every other named knob equal
                other = np.unravel_index(g, radix)
                return bool(self._peers[mine[at], other[at]]) and all(
                    a == b for k, (a, b) in enumerate(zip(mine, other)) if k != at)

            live = self.live_groups().tolist()
            self._kin_of[group] = tuple(sorted({group} | {int(g) for g in live if alike(g)}))
        return self._kin_of[group]

    def floor(self, i: int) -> int:
        """The least setting of ``i``'s power mode: the smallest batch size, every numeric knob at its lowest
        level, as it runs."""
        lv = self.levels(np.array([i]))
        lv[:, self.numeric_dims] = 0
        return int(self.canonical(self.flat(lv))[0])

    # -- neighbourhoods -------------------------------------------------------------------------------
    def neighbours(self, idx: np.ndarray) -> np.ndarray:
        """``idx`` and every setting one level up or down in one dimension (two in batch size) from them, as
        they run; on a rows space, rows only."""
        lv = self.levels(idx)
        out = [idx]
        for d, size in enumerate(self.sizes):
            for step in (_BATCH_STEPS if d == 0 else _KNOB_STEPS):
                moved = lv.copy()
                moved[:, d] += step
                ok = (moved[:, d] >= 0) & (moved[:, d] < size)
                if ok.any():
                    out.append(self.flat(moved[ok]))
        near = np.unique(self.canonical(np.concatenate(out)))
        return near if self.allowed is None else near[np.isin(near, self.allowed)]

    def shifted(self, index: int, dims: Sequence[int], step: int) -> np.ndarray:
        """The settings ``step`` levels from grid index ``index`` in one of ``dims`` each (those inside the
        grid), as they run (:meth:`canonical`); ``index`` itself, and on a rows space anything not a row,
        left out."""
        lv = self.levels(np.array([index]))[0]
        moved = [np.where(np.arange(lv.size) == d, lv + step, lv) for d in dims if 0 <= lv[d] + step < self.sizes[d]]
        if not moved:
            return np.array([], dtype=np.int64)
        near = np.unique(self.canonical(self.flat(np.array(moved))))
        near = near[near != index]
        return near if self.allowed is None else near[np.isin(near, self.allowed)]

    # -- what measured powers imply -------------------------------------------------------------------
    def power_bounds(self, cand: np.ndarray, idx: Sequence[int], powers_w: Sequence[float],
                     held_w: float | None) -> tuple[np.ndarray, np.ndarray]:
        """What the measured settings ``idx`` and their powers ``powers_w`` imply of the candidates' power
        (board power does not fall as the batch or a numeric knob rises, in one power mode; across modes the
        caps and cores differ, so no order): at least the power of any measured setting at or below the
        candidate in every such dimension, at most that of any measured setting at or above it that held
        ``held_w`` (None: every one; a setting stopped over the budget was stopped as its average crossed:
        its full figure is unknown, so it bounds from below only). A setting of another mode counts where
        the lower of the two runs alike under the higher one's mode (:meth:`runs_under`): a setting two
        modes both run is a candidate of one of them only. Returns the lower and upper bounds, W (-inf and
        inf where nothing bounds)."""
        lo = np.full(cand.size, -np.inf)
        hi = np.full(cand.size, np.inf)
        if not len(idx) or cand.size == 0:
            return lo, hi
        numeric = self.numeric_dims
        cl, g = self.levels(cand), self.group(cand)
        idx = np.array(idx, dtype=np.int64)
        ml, mg = self.levels(idx), self.group(idx)
        lv, mv = cl[:, numeric], ml[:, numeric]
        for k, pk in enumerate(powers_w):
            at_k = np.broadcast_to(ml[k], cl.shape)
            below = (g == mg[k]) | self.runs_under(at_k, cl)
            lo = np.where(below & np.all(lv >= mv[k], axis=1), np.maximum(lo, pk), lo)
            if held_w is None or pk <= held_w:
                above = (g == mg[k]) | self.runs_under(cl, at_k)
                hi = np.where(above & np.all(lv <= mv[k], axis=1), np.minimum(hi, pk), hi)
        return lo, hi

    def __repr__(self) -> str:
        return f"Grid(sizes={self.sizes}, settings={self.n})"
