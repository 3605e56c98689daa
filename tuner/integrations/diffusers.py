"""tuner.attention in a diffusers model or pipeline: `enable(target, max_error=None)`,
`disable(target)` and the context manager `enabled(target, max_error=None)`.

diffusers offers no public way to add an attention backend: `set_attention_backend` and
`attention_backend` take the members of the closed enum AttentionBackendName, and the registry
behind them is private. Public is the processor of each attention module (`module.processor`,
`module.set_processor`, which `model.set_attn_processor` calls), so `enable` wraps each in a
`Routed<its class>` that runs it unchanged inside a routing.SdpaRouter: projections, norms and
RoPE stay the model's own code, whatever the model class, and its torch SDPA call (diffusers'
default "native" backend, or the processor's own F.scaled_dot_product_attention) goes to
tuner.attention or falls back to torch's SDPA with a logged reason (routing's docstring).
`disable` puts the original processor objects back. A processor whose call reaches no torch SDPA
(another attention backend is set, or it writes attention out) runs as it is, logged once.

return_lse is never asked of a routed call: diffusers asks a registered backend for it only from
its context-parallel ring templates, and its native backend refuses it before calling SDPA.
In eager code every torch call inside a processor passes through the mode's Python handler (Wan's
processor makes 45; each costs about what one more small torch op does); torch.compile traces
the handler away, and a CUDA graph replays without it.

Supported: diffusers >= 0.35, < 0.43 (tested with 0.35.2, 0.38.0 and 0.42.1); `enable` outside
that range raises a TunerError saying so.
"""

from __future__ import annotations

import contextlib
import functools
import logging

import torch

from tuner.errors import TunerError
from tuner.integrations.routing import SdpaRouter, log_once

log = logging.getLogger("tuner.integrations")

SUPPORTED = ">=0.35,<0.43"


def enable(target, *, max_error: float | None = None) -> None:
    """Route the attention of `target` through tuner.attention: a diffusers model (any module
    holding diffusers attention modules) or a pipeline (each such model among its components).
    max_error is tuner.attention's (tuned winners above that stored end-to-end error are passed
    over). Enabling again wraps nothing twice and sets max_error on every routed processor."""
    _install(target, max_error)


def disable(target) -> None:
    """Put back the original processor of every routed attention module of `target`."""
    for _, module in _attention_modules(target):
        if _unwrapped(module.processor) is not module.processor:
            module.set_processor(module.processor.inner)


@contextlib.contextmanager
def enabled(target, *, max_error: float | None = None):
    """enable(target, max_error=...) for the block; on leaving, the processors it wrapped get
    their originals back (those routed before the block stay routed)."""
    installed = _install(target, max_error)
    try:
        yield target
    finally:
        for module, wrapper in installed:
            if module.processor is wrapper:
                module.set_processor(wrapper.inner)


def check_version() -> str:
    """The installed diffusers version, or a TunerError naming it and the supported range."""
    try:
        import diffusers
    except ImportError as error:
        raise TunerError("tuner.integrations.diffusers needs diffusers: "
                         "pip install -e '.[diffusers]'") from error
    from packaging.specifiers import SpecifierSet

    version = diffusers.__version__
    if not SpecifierSet(SUPPORTED).contains(version, prereleases=True):
        raise TunerError(f"diffusers {version} is not supported by tuner.integrations.diffusers "
                         f"(supported: {SUPPORTED}, docs/diffusers.md): install one in range "
                         f"with pip install -e '.[diffusers]'")
    return version


def _install(target, max_error) -> list[tuple]:
    """Wrap every unrouted processor; (module, wrapper) for each one wrapped."""
    if max_error is not None and (isinstance(max_error, bool) or not isinstance(
            max_error, int | float) or not max_error > 0):
        raise TunerError(f"max_error must be a positive number (a relative RMS error such as "
                         f"0.08) or None, got {max_error!r}")
    installed = []
    for _, module in _attention_modules(target):
        processor = module.processor
        if _unwrapped(processor) is processor:
            processor = _routed_class(type(processor))(processor)
            module.set_processor(processor)
            installed.append((module, processor))
        processor.max_error = max_error
    if installed:
        log.info("tuner: %d attention processors of %s route through tuner.attention",
                 len(installed), type(target).__name__)
    return installed


def _attention_modules(target) -> list[tuple[str, torch.nn.Module]]:
    """(name, module) of every diffusers attention module of target: those with a processor and
    set_processor, the method model.set_attn_processor calls on each (some models, DiT's,
    have no set_attn_processor of their own)."""
    check_version()
    if isinstance(target, torch.nn.Module):
        models = {"": target}
    else:
        components = getattr(target, "components", None)
        models = {name: c for name, c in components.items() if isinstance(c, torch.nn.Module)} \
            if isinstance(components, dict) else {}
    found = [(f"{prefix}.{name}" if prefix else name, module)
             for prefix, model in models.items() for name, module in model.named_modules()
             if hasattr(module, "set_processor") and hasattr(module, "processor")]
    if not found:
        raise TunerError(f"{type(target).__name__} holds no diffusers attention module (one "
                         "with a processor and set_processor): pass a diffusers model "
                         "(pipe.transformer, pipe.unet) or a pipeline")
    return found


def _unwrapped(processor):
    return processor.inner if isinstance(processor, _Routed | _RoutedModule) else processor


def _run(wrapper, args, kwargs):
    router = SdpaRouter(wrapper.max_error)
    with router:
        out = wrapper.inner(*args, **kwargs)
    if not torch.compiler.is_compiling() and router.calls == 0:
        name = type(wrapper.inner).__name__
        log_once(("unrouted", name), "tuner: %s made no torch SDPA call, so its attention did "
                 "not reach tuner.attention: another attention backend is set (model."
                 "reset_attention_backend() restores the native one), or it computes attention "
                 "itself", name)
    return out


class _Routed:
    """A processor's stand-in: runs it inside an SdpaRouter. Other attributes are the
    processor's, read and written (set_attention_backend writes _attention_backend)."""

    def __init__(self, inner) -> None:
        object.__setattr__(self, "inner", inner)
        object.__setattr__(self, "max_error", None)

    def __getattr__(self, name):
        if name == "inner":  # not set yet (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __setattr__(self, name, value) -> None:
        if name not in self.__dict__ and hasattr(self.inner, name):
            setattr(self.inner, name, value)
        else:
            object.__setattr__(self, name, value)


class _RoutedModule(torch.nn.Module):
    """_Routed for a processor that is an nn.Module (IP-Adapter's): it stays a submodule, so
    .to() and state_dict() still reach its weights (under the prefix `inner.`)."""

    def __init__(self, inner) -> None:
        super().__init__()
        self.inner = inner
        self.max_error = None

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "inner":
                raise
            return getattr(self._modules["inner"], name)

    def __setattr__(self, name, value) -> None:
        inner = self.__dict__.get("_modules", {}).get("inner")
        if inner is not None and name not in self.__dict__ and hasattr(inner, name):
            setattr(inner, name, value)
        else:
            super().__setattr__(name, value)


@functools.cache
def _routed_class(cls: type) -> type:
    """Routed<cls>: its __call__ shows cls.__call__'s signature, from which diffusers' attention
    modules pick the keyword arguments they pass (the others are dropped with a warning)."""

    @functools.wraps(cls.__call__)
    def __call__(self, *args, **kwargs):
        return _run(self, args, kwargs)

    base = _RoutedModule if issubclass(cls, torch.nn.Module) else _Routed
    return type(f"Routed{cls.__name__}", (base,), {"__call__": __call__, "__module__": __name__})
