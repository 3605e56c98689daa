"""The contract between the tuner and a kernel family (see shared DESIGN.md).

A family module provides:
  Config                                  frozen dataclass, fields == knobs == YAML names
  space(arch) -> dict[str, list]          knob domains, from search_spaces/<family>.yaml
  default(arch, problem) -> Config        heuristic default, its comment cites the measurement
  can_implement(cfg, problem, gpu)        -> (ok, reason): THE single statement of the constraints
  compile(cfg, problem, arch) -> Kernel   cached CuTe-DSL build; works with fake tensors on a CPU

A family whose kernels run on the CPU (the test doubles in tests/doubles/) also declares
  DEVICE = "cpu"                          the tuner needs no GPU for it (tuner/search/target.py)
and may provide
  seeds(arch, problem) -> list[Config]    configs every search measures right after the default
                                          (its neighbours along knobs whose best value moves with
                                          the shape), whatever the sampler proposes
  time_launch(kernel, call) -> float      runs call() once (a kernel.run or a kernel.prepare)
                                          and returns the ms it counts for (a modelled cost);
                                          without it perf_counter times the call.
Real families declare neither: CUDA events time a GPU launch (tuner/measure.py).

The tuner never looks inside a Kernel beyond `resources`, `prepare` and `run`.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

import yaml

SEARCH_SPACES_DIR = Path(__file__).resolve().parents[1] / "search_spaces"
# head_dim values the families generate and validate (each family's can_implement states its
# own limits too): the kernels read whole 16-byte rows of FP8 and tile head_dim by 32 or 64.
# The public checks (Problem, prepare.check_qkv) take them from here, the kernels' side.
HEAD_DIMS = (64, 128)
# Knobs that change prepare only, never the attention kernel (variants/transforms.py: exact
# transforms of q and k before quantizing), with their off values: the codegen key leaves them
# out, so configs that differ only in them share one build (variants/build.py).
PREPARE_ONLY_KNOBS = {"k_smoothing": "off", "qk_rotation": "none"}
# Their on values: K smoothing and Q/K rotation together are accurate on realistic activations
# (docs/accuracy.md).
TRANSFORMS_ON = {"k_smoothing": "mean", "qk_rotation": "hadamard"}


@dataclass(frozen=True)
class ResourceUsage:
    """Registers per thread, spill bytes and shared memory per CTA, read from the cubin."""

    registers: int
    spill_bytes: int
    smem_bytes: int


@runtime_checkable
class Kernel(Protocol):
    config: Any
    resources: ResourceUsage

    def prepare(self, q, k, v, softmax_scale: float | None = None, *, validate: bool = True,
                want_lse: bool = True):
        """bf16/fp16 (batch, seq_len, heads, head_dim) -> the FP8 inputs this config reads;
        validate=False skips the input checks (the caller made them); want_lse=False prepares
        for runs that drop the LSE (no K smoothing shift computed)."""

    def run(self, prepared, out=None, lse=None, *, want_lse: bool = True):
        """Launch on prepared inputs, into out/lse when given. Returns (out_bf16, lse_fp32).
        want_lse=False: the caller does not read the LSE, which is then that of the scores
        the kernel computed (without K smoothing's shift: prepared.restore_lse adds it)."""


class Family(Protocol):
    Config: type

    def space(self, arch: str) -> dict[str, list]: ...

    def default(self, arch: str, problem) -> Any: ...

    def can_implement(self, cfg, problem, gpu) -> tuple[bool, str | None]: ...

    def compile(self, cfg, problem, arch: str) -> Kernel: ...


class ConfigMixin:
    """to_dict/from_dict and a short label for frozen config dataclasses, and the V layout the
    family's prepare() must produce (CompiledKernel.prepare/run use these two properties)."""

    @property
    def v_feature_major(self) -> bool:
        """V stored (batch, heads, head_dim, padded), keys contiguous; False: as k is stored."""
        return True

    @property
    def v_key_permuted(self) -> bool:
        """V's keys stored in the register-P order (prepare.register_p_key_order)."""
        return self.register_p

    @property
    def q_in_kernel(self) -> bool:
        """The kernel reads the caller's bf16 q and quantizes it itself (prepare leaves q)."""
        return False

    @property
    def v_unquantized(self) -> bool:
        """The kernel reads V as bf16, unquantized (natural layout; its block scales neutral)."""
        return False

    @property
    def qk_int8(self) -> bool:
        """Q and K are int8 codes (amax / 127 block scales) for an integer QK^T GEMM."""
        return False

    @property
    def kv_head_scales(self) -> bool:
        """K's and V's descales are one per (batch, KV head), not per 64 keys: the family's
        kv_scales knob (block_scales.KV_SCALES) says "head"; False for a family without it."""
        return getattr(self, "kv_scales", "block") == "head"

    def for_q_dtype(self, dtype_name: str):
        """The config to run for a q of this torch dtype name (a family whose kernel reads
        some dtypes only names the config that reads the others). e4m3 codes were quantized by
        the caller: prepare's transforms cannot apply, so that twin has them off."""
        if dtype_name == "float8_e4m3fn":
            return self.without_transforms()
        return self

    def without_transforms(self):
        """This config with every prepare-only transform off (PREPARE_ONLY_KNOBS)."""
        names = {f.name for f in dataclasses.fields(self)}
        off = {k: v for k, v in PREPARE_ONLY_KNOBS.items() if k in names}
        return dataclasses.replace(self, **off) if off else self

    def with_transforms(self, **settings):
        """This config with its prepare-only transforms set to `settings` (default: every one
        on, TRANSFORMS_ON, the search's baseline where the plain config is over the accuracy
        budget), and whatever else the family needs to run them."""
        names = {f.name for f in dataclasses.fields(self)}
        on = {k: v for k, v in (settings or TRANSFORMS_ON).items() if k in names}
        return dataclasses.replace(self, **on) if on else self

    def transforms_on(self) -> list[str]:
        """`knob=value` of each prepare-only transform this config turns on."""
        return [f"{k}={getattr(self, k)!r}" for k, off in PREPARE_ONLY_KNOBS.items()
                if getattr(self, k, off) != off]

    # Old knob name -> today's, for tables and database rows written before a rename.
    RENAMED_KNOBS: ClassVar[dict[str, str]] = {}

    def to_dict(self) -> dict[str, Any]:
        # Knob values are scalars: a shallow copy, not asdict's deep one (the search turns
        # every feasible config of a space into a dict).
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        for old, new in cls.RENAMED_KNOBS.items():
            if old in data:
                if new in data:
                    from variants.errors import TunerError

                    raise TunerError(f"{cls.__name__}: both {old!r} and its new name {new!r} "
                                     f"given; keep only {new!r}")
                data = {(new if k == old else k): v for k, v in data.items()}
        fields = dataclasses.fields(cls)
        names = {f.name for f in fields}
        unknown = sorted(set(data) - names)
        # A knob with a default may be absent from a table or database row: the default is
        # the build such a row was measured with. Every other knob must be given.
        missing = sorted(f.name for f in fields if f.name not in data
                         and f.default is dataclasses.MISSING)
        if unknown or missing:
            from variants.errors import TunerError

            raise TunerError(
                f"{cls.__module__}.{cls.__name__}: unknown knobs {unknown}, "
                f"missing knobs {missing}; "
                f"expected {sorted(names)} (knobs with a default may be omitted)"
            )
        return cls(**data)

    def short(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.to_dict().items())


def load_space(family: str, arch: str) -> dict[str, list]:
    """Knob domains from search_spaces/<family>.yaml: `common` overlaid by `arch.<arch>`."""
    path = SEARCH_SPACES_DIR / f"{family}.yaml"
    with path.open() as fh:
        doc = yaml.safe_load(fh)
    space = dict(doc["common"])
    space.update((doc.get("arch") or {}).get(arch, {}) or {})
    return space


def enumerate_space(config_cls, space: dict[str, list]):
    """Every config of the cartesian product of the domains (feasibility is not checked here).
    The prepare-only knobs vary slowest: the first configs are distinct builds, each with the
    transforms off."""
    fields = [f.name for f in dataclasses.fields(config_cls)]
    names = [n for n in fields if n in PREPARE_ONLY_KNOBS] + \
        [n for n in fields if n not in PREPARE_ONLY_KNOBS]
    missing = [n for n in names if n not in space]
    if missing:
        raise KeyError(f"search space lacks knobs {missing} of {config_cls.__name__}")
    if hasattr(config_cls, "__post_init__") or hasattr(config_cls, "__slots__"):
        for values in itertools.product(*(space[n] for n in names)):
            yield config_cls(**dict(zip(names, values, strict=True)))
        return
    # A frozen dataclass without __post_init__ is its __dict__: filled directly, a third of the
    # cost of __init__'s per-field object.__setattr__ (wgmma's space is 3.5M configs).
    new = object.__new__
    for values in itertools.product(*(space[n] for n in names)):
        cfg = new(config_cls)
        cfg.__dict__.update(zip(names, values, strict=True))
        yield cfg


def judge_space(family, problem, gpu):
    """(config, ok, reason) for every config of `family`'s space on gpu.arch, with
    can_implement's verdict: the one enumeration the search and `tuner space` share."""
    for cfg in enumerate_space(family.Config, family.space(gpu.arch)):
        ok, reason = family.can_implement(cfg, problem, gpu)
        yield cfg, ok, reason
