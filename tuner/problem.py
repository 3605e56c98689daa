"""The attention problem a kernel is tuned for, with a stable key for caches and the database."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tuner.errors import TunerError

# head_dim values some family generates: the kernels' statement (variants/base.py), not ours.
from variants.base import HEAD_DIMS as SUPPORTED_HEAD_DIMS

# Upper bounds of the other dimensions, the sane range a user-given number must fall in (a
# larger one is a typo, and would otherwise overflow a launch argument or a database column):
# batch and heads are grid dimensions of the mma_sync launch (CUDA caps gridDim.y and .z at
# 65535); seq_len and its padded length are 32-bit launch arguments (2**30 leaves room for the
# padding, and is 35000x the longest sequence tuned so far). All fit PostgreSQL's 32-bit INTEGER.
MAX_DIMS = {"batch": 65535, "heads": 65535, "seq_len": 2**30}


def check_dimension(name: str, value) -> None:
    """One problem dimension (batch, heads, seq_len, head_dim) is an int in its range."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TunerError(f"Problem.{name} must be an int, got {value!r}")
    if value < 1:
        raise TunerError(
            f"Problem.{name} must be >= 1, got {value}; "
            "an empty attention has nothing to compute, skip the call instead"
        )
    if name in MAX_DIMS and value > MAX_DIMS[name]:
        raise TunerError(f"Problem.{name} must be <= {MAX_DIMS[name]}, got {value}")
    if name == "head_dim" and value not in SUPPORTED_HEAD_DIMS:
        raise TunerError(
            f"head_dim {value} is not supported; supported: {SUPPORTED_HEAD_DIMS} "
            "(pad the head dimension with zeros to the next supported size)"
        )


@dataclass(frozen=True)
class Problem:
    """Attention forward (non-causal for now) over q, k, v of (batch, seq_len, heads, head_dim)."""

    batch: int
    heads: int
    seq_len: int
    head_dim: int = 128
    causal: bool = False

    def __post_init__(self) -> None:
        for name in ("batch", "heads", "seq_len", "head_dim"):
            check_dimension(name, getattr(self, name))
        if not isinstance(self.causal, bool):
            raise TunerError(f"Problem.causal must be a bool, got {self.causal!r}")
        if self.causal:
            raise TunerError(
                "causal attention is not implemented yet (non-causal prefill comes first); "
                "use causal=False"
            )

    def key(self) -> str:
        """Stable text key: the same problem always maps to the same string, across versions."""
        mask = "causal" if self.causal else "full"
        return f"b{self.batch}-h{self.heads}-s{self.seq_len}-d{self.head_dim}-{mask}"

    @classmethod
    def from_key(cls, key: str) -> Problem:
        try:
            b, h, s, d, mask = key.split("-")
            return cls(int(b[1:]), int(h[1:]), int(s[1:]), int(d[1:]), mask == "causal")
        except (ValueError, IndexError) as exc:
            raise TunerError(
                f"malformed problem key {key!r}; expected e.g. 'b1-h56-s4096-d128-full'"
            ) from exc

    @property
    def flops(self) -> float:
        """Matmul FLOPs of the forward (2 GEMMs of 2*S*S*D per head), the usual FA count."""
        flops = 4.0 * self.batch * self.heads * self.seq_len * self.seq_len * self.head_dim
        return flops / 2 if self.causal else flops

    def tflops(self, ms: float) -> float:
        return self.flops / (ms * 1e-3) / 1e12

    def to_dict(self) -> dict:
        return asdict(self)
