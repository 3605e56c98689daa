"""The attention problem a kernel is tuned for, with a stable key for caches and the database."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tuner.errors import TunerError

# head_dim values some family generates: the kernels' statement (variants/base.py), not ours.
from variants.base import HEAD_DIMS as SUPPORTED_HEAD_DIMS


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
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TunerError(f"Problem.{name} must be an int, got {value!r}")
            if value < 1:
                raise TunerError(
                    f"Problem.{name} must be >= 1, got {value}; "
                    "an empty attention has nothing to compute, skip the call instead"
                )
        if self.head_dim not in SUPPORTED_HEAD_DIMS:
            raise TunerError(
                f"head_dim {self.head_dim} is not supported; supported: {SUPPORTED_HEAD_DIMS} "
                "(pad the head dimension with zeros to the next supported size)"
            )
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
