"""Which config should a wgmma default be? The shared half of the scripts that answer it
(default_hd64_h200.py, causal_default_h200.py): each candidate config is first run through the
correctness gate at a small ragged problem of the same kind, then timed at every shape as a
search times it, beside cuDNN FP8, and the table ranks the candidates by what a caller pays.

A candidate is (label, knobs): knob changes applied to the wgmma default of each shape's own
problem (an empty dict is that default), so one candidate list serves shapes whose defaults
differ (the head_dim-128 default quantizes Q in the kernel up to 1024 keys, say). A label whose
knobs carry a config of their own ("config" key) is that config at every shape."""

from __future__ import annotations

import dataclasses
import os
import time

import torch


def shapes_arg(text: str, default: list) -> list:
    """The scripts' --shapes value, "a,b,c;a,b,c;..." as tuples of ints (the default when empty)."""
    return [tuple(int(x) for x in s.split(",")) for s in text.split(";")] if text else default


def knobs_arg(text: str) -> dict:
    """The scripts' --knobs value, "knob=value,..." with each value read as YAML (kv_stages=3,
    intra_wg_overlap=false), as a dict of knob changes (empty when the text is)."""
    import yaml

    return {k: yaml.safe_load(v) for k, v in (kv.split("=") for kv in text.split(",") if kv)}


def candidate_config(knobs: dict, problem):
    """The config a candidate runs at problem."""
    from variants import wgmma

    if "config" in knobs:
        return knobs["config"]
    return dataclasses.replace(wgmma.default("sm_90a", problem), **knobs)


def gate(cands, *smalls) -> dict:
    """label -> True, or why the candidate failed the gate at the first of the small problems it
    failed at (it is then not timed anywhere)."""
    from tuner.gate import validate_kernel
    from variants import wgmma

    verdicts = {}
    for label, knobs in cands:
        verdicts[label] = True
        for small in smalls:
            seed = int.from_bytes(os.urandom(4), "little")
            cfg = candidate_config(knobs, small)
            report = validate_kernel(wgmma.compile(cfg, small, "sm_90a"), small,
                                     torch.device("cuda"), seed)
            if not report.passed:
                verdicts[label] = f"{small.key()}, seed={seed}: {report.reason}"
                break
    return verdicts


def measure(problem, cands, verdicts) -> dict:
    """Kernel and prepare ms of every gated candidate at problem (time_kernel: L2-cold input
    rotation, fresh random inputs, median of 20), and cuDNN FP8's kernel where it runs."""
    from tuner.gpus import PROFILES
    from tuner.measure import time_kernel
    from tuner.peers import PeerUnavailable, make_peer
    from variants import wgmma

    l2 = PROFILES["h200"].l2_bytes
    row = {"problem": problem.to_dict(), "kernel_ms": {}, "prepare_ms": {}, "refused": {},
           "configs": {}}
    for label, knobs in cands:
        if verdicts[label] is not True:
            row["refused"][label] = f"failed the gate: {verdicts[label]}"
            continue
        cfg = candidate_config(knobs, problem)
        ok, reason = wgmma.can_implement(cfg, problem, PROFILES["h200"])
        if not ok:
            row["refused"][label] = reason
            continue
        seed = int.from_bytes(os.urandom(4), "little")
        t = time_kernel(wgmma.compile(cfg, problem, "sm_90a"), problem, torch.device("cuda"),
                        seed, l2)
        row["kernel_ms"][label], row["prepare_ms"][label] = t.median_ms, t.prepare_ms
        row["configs"][label] = cfg.to_dict()
    try:
        t = time_kernel(make_peer("cudnn-fp8", problem), problem, torch.device("cuda"), 1, l2)
        row["cudnn_ms"] = t.median_ms
    except PeerUnavailable as exc:
        row["cudnn_ms"], row["refused"]["cudnn-fp8"] = None, str(exc)
    return row


def shape_label(problem: dict) -> str:
    label = f"{problem['batch']}, {problem['seq_len']}, {problem['heads']}"
    if problem["kv_heads"] != problem["heads"]:
        label += f" on {problem['kv_heads']} KV"
    if problem["head_dim"] != 128:
        label += f", D={problem['head_dim']}"
    return label


def table(rows, labels, device: str, what: str) -> str:
    """Markdown: kernel ms / prepare + kernel ms per candidate, in brackets the first
    candidate's prepare + kernel over this one's."""
    first = labels[0]
    lines = [f"Measured on {device}, {time.strftime('%Y-%m-%d')}, {what}: kernel ms / prepare + "
             "kernel ms (time_kernel: L2-cold, median of 20); in brackets the "
             f"{first!r} candidate's prepare + kernel time / this one's (above 1: faster). "
             "cuDNN FP8: its kernel on e4m3 inputs.", "",
             "| B, S, H | " + " | ".join(labels) + " | cuDNN FP8 | best kernel vs cuDNN |",
             "|" + "---|" * (len(labels) + 3)]
    for r in rows:
        total = {lab: r["kernel_ms"][lab] + r["prepare_ms"][lab] for lab in r["kernel_ms"]}
        base = total.get(first)
        cells = []
        for lab in labels:
            if lab not in total:
                cells.append("refused")
                continue
            ratio = f" ({base / total[lab]:.2f}x)" if base else ""
            cells.append(f"{r['kernel_ms'][lab]:.3f} / {total[lab]:.3f}{ratio}")
        cudnn = r.get("cudnn_ms")
        best = min(r["kernel_ms"].values()) if r["kernel_ms"] else None
        peer = f"{cudnn:.3f} | {cudnn / best:.2f}" if cudnn and best else "- | -"
        lines.append(f"| {shape_label(r['problem'])} | " + " | ".join(cells) + f" | {peer} |")
    return "\n".join(lines)
