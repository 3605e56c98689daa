"""The split_tail decomposition (variants/wgmma/split_tail.py) on the CPU: the pieces the
persistent loop walks cover every tile's strips exactly once, the counters reach each tile's
strip count exactly at its last piece, and the merging warp finds every other piece's slot."""

from __future__ import annotations

import random

import pytest

from variants.wgmma import split_tail as st


@pytest.fixture
def always_split(monkeypatch):
    """The decomposition itself, with every tail split (the cost rule is tested on its own)."""
    monkeypatch.setattr(st, "MIN_SAVED_STRIPS", 0)


def _walk(total, grid, strips):
    """{tile: [(cta, piece, lo, hi)]} as the kernels' loops visit them: the whole tiles' launch
    (grid min(whole, SMs), tiles below `whole`), then the pieces program's."""
    tail = st.split_tiles(total, grid, strips)
    dp = total - tail
    seen = {}
    whole_grid = max(min(dp, grid), 1)
    for cta in range(whole_grid):
        for item in range(cta, dp, whole_grid):
            seen.setdefault(item, []).append((cta, None, 0, strips))
    for cta in range(grid):
        limit = st.work_limit(total, grid, cta, strips)
        assert limit in (0, grid, 2 * grid)
        for j in range(cta, limit, grid):
            t, lo, hi = st.tail_piece(j, grid, tail, strips)
            assert 0 <= lo < hi <= strips, (total, grid, strips, cta, j)
            seen.setdefault(dp + t, []).append((cta, j // grid, lo, hi))
    return seen, dp


SHAPES = [(1728, 132, 36), (1792, 132, 32), (64, 132, 8), (1, 132, 1), (1, 132, 3),
          (131, 132, 2), (133, 132, 5), (264, 132, 7), (3, 7, 1), (10, 4, 3), (5, 8, 2)]


@pytest.mark.parametrize("total,grid,strips", SHAPES)
def test_pieces_cover_every_strip_once(total, grid, strips, always_split):
    seen, dp = _walk(total, grid, strips)
    assert sorted(seen) == list(range(total))
    for tile, pieces in seen.items():
        covered = sorted(s for _, _, lo, hi in pieces for s in range(lo, hi))
        assert covered == list(range(strips)), (tile, pieces)
        # whole-wave tiles are one item; tail tiles only pieces (at most two per CTA)
        assert all((piece is None) == (tile < dp) for _, piece, _, _ in pieces)


@pytest.mark.parametrize("total,grid,strips", SHAPES)
def test_merging_warp_finds_every_piece(total, grid, strips, always_split):
    """The owners of a tail tile's first and last unit bound the CTAs that hold its pieces, and
    each one's piece index is t - start // strips: the slots the merge reads."""
    seen, dp = _walk(total, grid, strips)
    units = st.split_tiles(total, grid, strips) * strips
    for tile, pieces in seen.items():
        if tile < dp:
            continue
        t = tile - dp
        first = st.unit_owner(t * strips, grid, units)
        last = st.unit_owner(t * strips + strips - 1, grid, units)
        found = set()
        for cta in range(first, last + 1):
            start, end = st.run_bounds(cta, grid, units)
            if end > start:
                found.add((cta, t - start // strips))
        assert found == {(cta, piece) for cta, piece, _, _ in pieces}
        slots = {st.slot(c, p) for c, p in found}
        assert len(slots) == len(found) and max(slots) < st.PIECES_PER_CTA * grid


def test_counters_complete_at_the_last_piece_in_any_order(always_split):
    total, grid, strips = 1728, 132, 36
    seen, dp = _walk(total, grid, strips)
    for tile, pieces in ((t, p) for t, p in seen.items() if t >= dp):
        rng = random.Random(tile)
        for _ in range(50):
            order = rng.sample(pieces, len(pieces))
            count, last = 0, []
            for _, _, lo, hi in order:
                old = count
                count += hi - lo
                last.append(old + (hi - lo) == strips)
            assert last == [False] * (len(order) - 1) + [True]


@pytest.mark.parametrize("total,strips,splits", [
    (1728, 36, True),     # B=2 S=4608 H=24: 12 of 132 in the last wave, 32.7 strips saved
    (1792, 32, True),     # S=4096 H=56: 76 of 132, 13.6
    (1280, 32, False),    # S=4096 H=40: 92 of 132, 9.7
    (448, 8, False),      # S=1024 H=56: 52 of 132, 4.8
    (1024, 8, False),     # B=4 S=1024 H=32
    (2 * 132, 64, False),  # no tail
    (64, 64, True),       # 64 tiles on 132 SMs: every tile split about two ways
    (32, 8, False),
])
def test_the_split_runs_where_it_saves_more_than_it_costs(total, strips, splits):
    tail = st.split_tiles(total, 132, strips)
    assert tail == (total % 132 if splits else 0)
    # Without a split the pieces program has no work.
    if not splits:
        assert all(st.work_limit(total, 132, cta, strips) == 0 for cta in range(132))


def test_workspace_layout():
    words = st.workspace_words(128, 128, 8, 132)
    counters = st.workspace_offsets(128, 128, 132)[1]
    assert counters == 2 * 132 * 128 * 128 + 2 * 132 * 2 * 128
    assert words - counters == 132 * 8
    assert counters % 4 == 0  # the counters' offset keeps 16-byte alignment of the O slots


def test_the_launch_sizes_its_workspace_by_the_kernels_rule(monkeypatch):
    """The host hook (variants/wgmma/build.py) allocates split_tail's scratch exactly where the
    kernel splits: none for a config without the knob or a problem the rule keeps whole, the
    slots and counters of split_tail.workspace_words for the device's grid otherwise."""
    import dataclasses
    from types import SimpleNamespace

    import torch

    from tuner.problem import Problem
    from variants import wgmma
    from variants.wgmma import build

    monkeypatch.setattr(build, "_sm_count_arg", lambda device: (132,))

    def prepared(batch, seq, heads, seq_kv):
        return SimpleNamespace(q=torch.empty(batch, seq, heads, 0), seq_len=seq,
                               seq_len_kv=seq_kv)

    cfg = dataclasses.replace(wgmma.default("sm_90a", Problem(2, 24, 4608)), split_tail=False)
    split = build._workspace_words(dataclasses.replace(cfg, split_tail=True), 128)
    assert build._workspace_words(cfg, 128)("cuda", prepared(2, 4608, 24, 4608)) == 0
    # 1728 tiles of 128 rows, 36 strips: a tail of 12 is split.
    assert split("cuda", prepared(2, 4608, 24, 4608)) == st.workspace_words(128, 128, 8, 132)
    # 448 tiles, 8 strips: the rule keeps the tail whole, so no scratch.
    assert split("cuda", prepared(1, 1024, 56, 1024)) == 0
    # Cross-attention: the strips are the keys'.
    assert split("cuda", prepared(1, 1000, 4, 4000)) != 0
    assert split("cuda", prepared(1, 1000, 4, 1000)) == 0


def test_a_launch_the_rule_keeps_whole_runs_the_single_launch_build(monkeypatch):
    """Where the rule keeps the tail whole (no workspace), a split_tail kernel hands the launch
    to its split_tail=False twin (variants.build.CompiledKernel._single_launch: one launch, no
    empty second one); where it splits, it launches its own two programs with the scratch."""
    import dataclasses
    from types import SimpleNamespace

    import torch

    from tuner.problem import Problem
    from variants import build as shared_build
    from variants import launch, wgmma
    from variants.base import ResourceUsage
    from variants.wgmma import build

    monkeypatch.setattr(build, "_sm_count_arg", lambda device: (132,))
    monkeypatch.setattr(launch, "current_stream_handle", lambda device: 0)
    cfg = dataclasses.replace(wgmma.default("sm_90a", Problem(2, 24, 4608)), q_quant="prepare",
                              split_tail=True, k_smoothing="off",
                              qk_rotation="none")  # inputs below: untransformed
    twin_runs, own_launches = [], []
    twin = SimpleNamespace(run=lambda prepared, out=None, lse=None, want_lse=True:
                           twin_runs.append(prepared) or ("twin", None))
    kernel = shared_build.CompiledKernel(
        config=cfg, problem=Problem(2, 24, 4608), arch="sm_90a",
        resources=ResourceUsage(registers=168, spill_bytes=0, smem_bytes=0),
        compile_seconds=0.0, _fn=object(), _workspace_words=build._workspace_words(cfg, 128),
        _single_launch=twin)
    monkeypatch.setattr(kernel, "_launcher",
                        lambda device: (lambda *values: own_launches.append(values), (132,)))

    def prepared(batch, seq, heads):
        padded = -(-seq // cfg.pad_to()) * cfg.pad_to()
        return SimpleNamespace(
            q=torch.empty(batch, padded, heads, 128, dtype=torch.uint8),
            k=torch.empty(batch, padded, heads, 128, dtype=torch.uint8),
            v=torch.empty(batch, heads, 128, padded, dtype=torch.uint8),
            packed=torch.empty(1), seq_len=seq, seq_len_kv=seq, padded_len=padded,
            padded_len_kv=padded, softmax_scale=0.088, q_in_kernel=False, v_unquantized=False,
            v_feature_major=cfg.v_feature_major, key_permuted=cfg.v_key_permuted, k_mean=None,
            qk_rotated=False)

    # 448 tiles of 8 strips on 132 SMs: kept whole, so the twin runs it.
    short = prepared(1, 1024, 56)
    assert kernel.run(short) == ("twin", None)
    assert twin_runs == [short] and not own_launches
    # 1728 tiles of 36 strips: the tail is split, in this kernel's launch, with its scratch.
    out, lse = kernel.run(prepared(2, 4608, 24))
    assert len(twin_runs) == 1 and len(own_launches) == 1
    assert own_launches[0][6] != 0  # the workspace pointer
    assert out.shape == (2, 4608, 24, 128) and lse.shape == (2, 24, 4608)
