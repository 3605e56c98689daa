"""Installing tuner.integrations.diffusers on real diffusers models and a pipeline (tiny, random
weights, CPU): enable wraps every attention processor once, disable and the context manager put
the original objects back, a wrapped processor keeps the signature diffusers picks keyword
arguments by and the attributes diffusers writes, a processor that makes no SDPA call is
reported, the supported diffusers versions are checked, and importing tuner imports no
diffusers. Routing itself: tests/test_diffusers.py."""

from __future__ import annotations

import inspect
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("diffusers")

import diffusers  # noqa: E402
from diffusers import (  # noqa: E402
    AutoencoderKL,
    DDIMScheduler,
    DiTPipeline,
    DiTTransformer2DModel,
    FluxTransformer2DModel,
    WanTransformer3DModel,
)
from diffusers.models.transformers.transformer_flux import (  # noqa: E402
    FluxIPAdapterAttnProcessor,
)

from tuner.errors import TunerError  # noqa: E402
from tuner.integrations import diffusers as tuner_diffusers  # noqa: E402
from tuner.integrations import routing  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def fresh_routing():
    routing.clear_cache()
    yield
    routing.clear_cache()


@pytest.fixture
def restore_backend():
    """set_attention_backend also sets diffusers' process-wide active backend: put it back."""
    from diffusers.models.attention_dispatch import attention_backend

    with attention_backend("native"):
        yield


def wan():
    torch.manual_seed(0)
    return WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=64,
                                 in_channels=4, out_channels=4, text_dim=32, freq_dim=32,
                                 ffn_dim=64, num_layers=2, rope_max_seq_len=64).eval()


def run_wan(model):
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        return model(torch.randn(1, 4, 2, 8, 8, generator=g), torch.tensor([500]),
                     torch.randn(1, 7, 32, generator=g), return_dict=False)[0]


def processors(model) -> dict:
    return {name: m.processor for name, m in model.named_modules() if hasattr(m, "set_processor")}


def test_enable_wraps_each_processor_once_and_disable_puts_the_originals_back():
    model = wan()
    originals = processors(model)
    want = run_wan(model)
    tuner_diffusers.enable(model)
    tuner_diffusers.enable(model)
    routed = processors(model)
    assert len(routed) == 4
    assert all(type(p).__name__ == "RoutedWanAttnProcessor" and p.inner is originals[name]
               for name, p in routed.items())
    assert model.attn_processors.keys() == {f"{n}.processor" for n in originals}
    tuner_diffusers.disable(model)
    assert all(p is originals[name] for name, p in processors(model).items())
    assert torch.equal(run_wan(model), want)


def test_the_context_manager_restores_what_it_wrapped_even_on_an_error():
    model, other = wan(), wan()
    originals = processors(model)
    tuner_diffusers.enable(other)
    before = processors(other)
    with pytest.raises(RuntimeError, match="planted"), tuner_diffusers.enabled(model):
        assert all(p.inner is originals[n] for n, p in processors(model).items())
        with tuner_diffusers.enabled(other):
            pass
        raise RuntimeError("planted")
    assert all(p is originals[name] for name, p in processors(model).items())
    # `other` was routed before its block: it stays so, with the same wrappers.
    assert all(p is before[name] for name, p in processors(other).items())


def test_a_pipeline_routes_every_model_it_holds_and_runs_to_the_end():
    # DiT's transformer has no set_attn_processor of its own and uses the classic
    # AttnProcessor2_0, which calls F.scaled_dot_product_attention itself; the VAE has a
    # mid-block attention with one head of 32 channels. On the CPU every call falls back.
    torch.manual_seed(0)
    transformer = DiTTransformer2DModel(num_attention_heads=2, attention_head_dim=64,
                                        in_channels=4, out_channels=8, num_layers=2,
                                        sample_size=8, patch_size=2, num_embeds_ada_norm=1000,
                                        norm_num_groups=32).eval()
    vae = AutoencoderKL(block_out_channels=[32], latent_channels=4, norm_num_groups=32,
                        down_block_types=["DownEncoderBlock2D"],
                        up_block_types=["UpDecoderBlock2D"], sample_size=8).eval()
    pipe = DiTPipeline(transformer=transformer, vae=vae, scheduler=DDIMScheduler())
    pipe.set_progress_bar_config(disable=True)

    def generate():
        return pipe(class_labels=[1], num_inference_steps=2, guidance_scale=2.0,
                    generator=torch.Generator().manual_seed(0), output_type="np").images

    want = generate()
    originals = [m.processor for m in (*transformer.modules(), *vae.modules())
                 if hasattr(m, "set_processor")]
    tuner_diffusers.enable(pipe)
    routed = [m.processor for m in (*transformer.modules(), *vae.modules())
              if hasattr(m, "set_processor")]
    assert [type(p).__name__ for p in routed] == ["RoutedAttnProcessor2_0"] * 4
    assert (generate() == want).all()
    tuner_diffusers.disable(pipe)
    assert all(p is o for p, o in zip([m.processor for m in (*transformer.modules(),
               *vae.modules()) if hasattr(m, "set_processor")], originals, strict=True))


def test_a_wrapped_processor_shows_the_signature_diffusers_picks_kwargs_by():
    # FluxAttention passes a keyword argument only if the processor's __call__ names it: the
    # IP-Adapter images reach the processor through ip_hidden_states.
    torch.manual_seed(0)
    model = FluxTransformer2DModel(patch_size=1, in_channels=8, num_layers=1,
                                   num_single_layers=0, attention_head_dim=64,
                                   num_attention_heads=2, joint_attention_dim=32,
                                   pooled_projection_dim=16, axes_dims_rope=(8, 28, 28)).eval()
    attn = model.transformer_blocks[0].attn
    attn.set_processor(FluxIPAdapterAttnProcessor(128, 24, num_tokens=(4,)))
    ip = FluxIPAdapterAttnProcessor
    g = torch.Generator().manual_seed(1)
    hidden, text = torch.randn(1, 16, 128, generator=g), torch.randn(1, 5, 128, generator=g)
    images = [torch.randn(1, 4, 24, generator=g)]

    def call(**kwargs):
        with torch.no_grad():
            return attn(hidden, text, **kwargs)[2]  # the IP-Adapter attention output

    with_images = call(ip_hidden_states=images)
    assert not torch.equal(with_images, call(ip_hidden_states=[images[0] * 2]))
    tuner_diffusers.enable(model)
    wrapper = attn.processor
    assert inspect.signature(wrapper.__call__) == inspect.signature(ip.__call__.__get__(object()))
    assert torch.equal(call(ip_hidden_states=images), with_images)
    # An nn.Module processor stays a submodule: .to() and state_dict() reach its weights.
    assert "transformer_blocks.0.attn.processor.inner.to_k_ip.0.weight" in model.state_dict()
    model.to(torch.float16)
    assert wrapper.inner.to_k_ip[0].weight.dtype == torch.float16
    tuner_diffusers.disable(model)
    assert isinstance(attn.processor, ip) and attn.processor is wrapper.inner
    assert "transformer_blocks.0.attn.processor.to_k_ip.0.weight" in model.state_dict()


def test_attributes_diffusers_writes_reach_the_wrapped_processor(restore_backend):
    model = wan()
    tuner_diffusers.enable(model)
    model.set_attention_backend("_native_math")  # still torch SDPA, so still routed
    wrapped = processors(model)
    assert all(p.inner._attention_backend == "_native_math" for p in wrapped.values())
    assert all("_attention_backend" not in vars(p) for p in wrapped.values())


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_a_processor_that_makes_no_sdpa_call_is_reported_once(restore_backend, caplog):
    model = wan()
    tuner_diffusers.enable(model)
    model.set_attention_backend("flex")  # attention through flex_attention: no SDPA to route
    caplog.set_level(logging.WARNING, "tuner.integrations")
    for _ in range(2):
        run_wan(model)
    unrouted = [r.getMessage() for r in caplog.records if "made no torch SDPA call" in
                r.getMessage()]
    assert len(unrouted) == 1 and unrouted[0].startswith("tuner: WanAttnProcessor made no")


@pytest.mark.parametrize("version", ["0.34.0", "0.43.0", "0.43.0.dev0"])
def test_a_diffusers_version_outside_the_supported_range_is_refused(version, monkeypatch):
    monkeypatch.setattr(diffusers, "__version__", version)
    with pytest.raises(TunerError, match=rf"diffusers {version} is not supported .*"
                                         rf"supported: >=0\.35,<0\.43"):
        tuner_diffusers.enable(wan())


def test_the_installed_diffusers_is_in_the_supported_range():
    assert tuner_diffusers.check_version() == diffusers.__version__


def test_a_target_without_attention_modules_is_refused():
    with pytest.raises(TunerError, match="Linear holds no diffusers attention module"):
        tuner_diffusers.enable(torch.nn.Linear(2, 2))


def test_importing_tuner_imports_no_diffusers():
    code = ("import sys, tuner, tuner.integrations, tuner.integrations.routing; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'diffusers'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
