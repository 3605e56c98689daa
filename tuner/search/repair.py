"""The nearest feasible config to a proposal the search cannot use.

TPE samples the product of the knob domains, where most points are infeasible (wgmma on an H100:
151k of 3.5M) or, under an accuracy budget, of a ruled-out class (accuracy_classes.py). Such a
proposal is told to the study as it is (TPE learns where not to go), and the config that differs
from it in the fewest knobs among those feasible, not yet measured or claimed and not ruled out
is enqueued as the next trial: the proposal's other choices are kept, one ask instead of the
several a sampler takes to land on a feasible point by itself (each ask writes every knob to the
study's database). Ties are broken at random, seeded by the study's seed and the trial number, so
a search repeats itself.

The feasible configs of a family are held as a matrix of knob-value indices (a row per config),
built on the first repair: a repair is one vectorised comparison against every row.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np


class _Family:
    """One family's feasible configs: knob-value indices, hashes, configs, class ids."""

    def __init__(self, domains: dict[str, list], rows: list[tuple[str, dict, tuple]]) -> None:
        self.knobs = list(domains)
        self.index = {k: {_key(v): i for i, v in enumerate(vals)} for k, vals in domains.items()}
        self.hashes = [h for h, _, _ in rows]
        self.configs = [c for _, c, _ in rows]
        self.matrix = np.empty((len(rows), len(self.knobs)), dtype=np.int16)
        for j, knob in enumerate(self.knobs):  # a column at a time, _key inlined: 90k in ~0.3 s
            index = self.index[knob]
            self.matrix[:, j] = [index[type(v) is bool, v] for v in
                                 (c[knob] for c in self.configs)]
        self.row_of = {h: i for i, h in enumerate(self.hashes)}
        self.classes: dict[tuple, int] = {}  # accuracy_class -> class id
        self.class_ids = np.array([self.classes.setdefault(key, len(self.classes))
                                   for _, _, key in rows], dtype=np.int32)


class Repairer:
    """nearest(): the feasible config to measure instead of an unusable proposal."""

    def __init__(self, space, seed: int) -> None:
        self.space, self.seed = space, seed
        self._families: dict[str, _Family] = {}

    def nearest(self, family: str, config: dict, number: int, taken: Collection[str],
                ruled_out: Collection[tuple]) -> dict | None:
        """The config of `family` nearest to `config` (fewest knobs differing), feasible, its hash
        not in `taken` and its class not in `ruled_out`; None when no such config is left."""
        fam = self._family(family)
        if not fam.hashes:
            return None
        wanted = np.array([fam.index[k].get(_key(config.get(k)), -1) for k in fam.knobs],
                          dtype=np.int16)
        distance = (fam.matrix != wanted).sum(axis=1)
        usable = np.ones(len(fam.hashes), dtype=bool)
        usable[[fam.row_of[h] for h in taken if h in fam.row_of]] = False
        dead = [fam.classes[key] for key in ruled_out if key in fam.classes]
        usable &= ~np.isin(fam.class_ids, dead)
        if not usable.any():
            return None
        distance = np.where(usable, distance, len(fam.knobs) + 1)
        ties = np.flatnonzero(distance == distance.min())
        pick = np.random.default_rng([self.seed, number]).choice(ties)
        return fam.configs[int(pick)]

    def _family(self, family: str) -> _Family:
        if family not in self._families:
            rows = [(h, c, key) for h, (f, c), key in zip(
                self.space.hashes, self.space.feasible, self.space.classes, strict=True)
                if f == family]
            self._families[family] = _Family(self.space.spaces[family], rows)
        return self._families[family]


def _key(value):
    """A domain value as a dict key that keeps True apart from 1 (and False from 0)."""
    return (type(value) is bool, value)
