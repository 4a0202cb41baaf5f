"""The model zoo: the architectures users bring, each built from a config with random weights.

Every family builds at two sizes from the same code: ``"tiny"`` (seconds on a CPU, for CI) and
``"bench"`` (hundreds of MB to a few GB on a GPU). A case is one family under one workload
(full fine-tuning in fp32 or bf16 autocast, LoRA, an inference forward, ``generate`` with a
cache); ``case.build(device, size)`` makes the model, its batch and its loss on ``device``
(``"meta"`` for the estimate, ``"cuda"`` or ``"cpu"`` for the measurement). Models are built
directly on the device, never with ``to_empty()``, so tied embeddings stay tied and integer
buffers (positions, relative positions) hold their values, as loading would leave them.

Nothing is downloaded. Families whose package is missing (torchvision, timm, diffusers, peft)
say so through :func:`available`.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

SIZES = ("tiny", "bench")


@dataclass(frozen=True)
class Built:
    """A model on a device with what one step needs."""

    model: Any
    batch: Any
    loss: Callable[[Any, Any], Any]  # loss(model, batch): the scalar loss, or the outputs
    make_batch: Callable[[int], Any]  # make_batch(n): a batch of n samples on the same device


@dataclass(frozen=True)
class Case:
    """One row of the zoo: a family under one workload."""

    name: str
    family: str
    workload: str  # "train", "lora", "inference" or "generate"
    precision: str | None = (
        None  # the Config precision of a training or inference row (None: as built)
    )
    dtype: str = "float32"  # the weights' dtype as built
    attention: str | None = None  # transformers' attn_implementation
    generate: dict[str, Any] = field(default_factory=dict)  # generate's keyword arguments
    needs: tuple[str, ...] = ()  # packages the family needs beyond torch and transformers

    def build(self, device: str, size: str) -> Built:
        """The model, batch and loss of this case on ``device`` at ``size``."""
        import torch

        if size not in SIZES:
            raise ValueError(f"size is one of {SIZES}, got {size!r}")
        torch.manual_seed(0)
        with self._making(device):
            built = FAMILIES[self.family](size, self.attention)
        make = built.make_batch

        def make_batch(n: int) -> Any:
            with self._making(device):
                return make(n)

        built = Built(built.model, built.batch, built.loss, make_batch)
        if self.workload == "lora":
            built = _with_lora(built)
        if self.workload in ("inference", "generate"):
            built.model.eval()
        return built

    @contextmanager
    def _making(self, device: str) -> Iterator[None]:
        """Tensors made inside are this case's dtype (floating ones) on ``device``."""
        import torch

        default = torch.get_default_dtype()
        torch.set_default_dtype(getattr(torch, self.dtype))
        try:
            with torch.device(device):
                yield
        finally:
            torch.set_default_dtype(default)

    @property
    def trains(self) -> bool:
        return self.workload in ("train", "lora")


def available(case: Case) -> str | None:
    """Why ``case`` cannot be built here (a missing package), or None."""
    for package in ("transformers", *case.needs):
        if importlib.util.find_spec(package) is None:
            return f"needs {package}, not installed"
    return None


# -- shapes per size -------------------------------------------------------------------------
# (batch, tokens) of a language-model batch; widths of a decoder
_TOKENS = {"tiny": (2, 32), "bench": (4, 512)}
_LM = {
    "tiny": dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    ),
    "bench": dict(
        vocab_size=32000,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=8,
        num_attention_heads=16,
        num_key_value_heads=4,
        max_position_embeddings=4096,
    ),
}
_IMAGES = {"tiny": (2, 32), "bench": (32, 224)}  # (batch, side)


def _ids(size: str, vocab: int, n: int | None = None) -> Any:
    import torch

    batch, tokens = _TOKENS[size]
    return torch.randint(1, vocab, (n or batch, tokens))


def _lm_loss(m: Any, b: Any) -> Any:
    return m(input_ids=b, labels=b).loss


def _lm(size: str, model: Any, vocab: int) -> Built:
    return Built(model, _ids(size, vocab), _lm_loss, lambda n: _ids(size, vocab, n))


def _decoder(config_name: str, model_name: str, **overrides: Any) -> Callable[..., Built]:
    """A decoder family from transformers' ``config_name`` and ``model_name`` classes."""

    def build(size: str, attention: str | None) -> Built:
        import transformers

        dims = {**_LM[size], **overrides.get(size, {}), **overrides.get("all", {})}
        config = getattr(transformers, config_name)(**dims)
        if attention is not None:
            config._attn_implementation = attention
        model = getattr(transformers, model_name)(config)
        return _lm(size, model, config.vocab_size)

    return build


def _gpt2(size: str, attention: str | None) -> Built:
    import transformers

    d = _LM[size]
    config = transformers.GPT2Config(
        vocab_size=d["vocab_size"],
        n_embd=d["hidden_size"],
        n_layer=d["num_hidden_layers"],
        n_head=d["num_attention_heads"],
        n_positions=d["max_position_embeddings"],
    )
    if attention is not None:
        config._attn_implementation = attention
    return _lm(size, transformers.GPT2LMHeadModel(config), config.vocab_size)


def _opt(size: str, attention: str | None) -> Built:
    import transformers

    d = _LM[size]
    config = transformers.OPTConfig(
        vocab_size=d["vocab_size"],
        hidden_size=d["hidden_size"],
        ffn_dim=d["intermediate_size"],
        num_hidden_layers=d["num_hidden_layers"],
        num_attention_heads=d["num_attention_heads"],
        max_position_embeddings=d["max_position_embeddings"],
        word_embed_proj_dim=d["hidden_size"],
    )
    if attention is not None:
        config._attn_implementation = attention
    return _lm(size, transformers.OPTForCausalLM(config), config.vocab_size)


def _falcon(size: str, attention: str | None) -> Built:
    import transformers

    d = _LM[size]
    config = transformers.FalconConfig(
        vocab_size=d["vocab_size"],
        hidden_size=d["hidden_size"],
        num_hidden_layers=d["num_hidden_layers"],
        num_attention_heads=d["num_attention_heads"],
        num_kv_heads=d["num_key_value_heads"],
        new_decoder_architecture=True,
    )
    if attention is not None:
        config._attn_implementation = attention
    return _lm(size, transformers.FalconForCausalLM(config), config.vocab_size)


def _neox(size: str, attention: str | None) -> Built:
    import transformers

    d = _LM[size]
    config = transformers.GPTNeoXConfig(
        vocab_size=d["vocab_size"],
        hidden_size=d["hidden_size"],
        intermediate_size=d["intermediate_size"],
        num_hidden_layers=d["num_hidden_layers"],
        num_attention_heads=d["num_attention_heads"],
        max_position_embeddings=d["max_position_embeddings"],
    )
    if attention is not None:
        config._attn_implementation = attention
    return _lm(size, transformers.GPTNeoXForCausalLM(config), config.vocab_size)


def _mamba(size: str, attention: str | None) -> Built:
    import transformers

    d = _LM[size]
    config = transformers.MambaConfig(
        vocab_size=d["vocab_size"],
        hidden_size=d["hidden_size"] // 2,
        num_hidden_layers=d["num_hidden_layers"],
        state_size=16,
    )
    return _lm(size, transformers.MambaForCausalLM(config), config.vocab_size)


def _masked(config_name: str, model_name: str) -> Callable[..., Built]:
    """An encoder trained as a masked LM (labels: the inputs)."""

    def build(size: str, attention: str | None) -> Built:
        import transformers

        d = _LM[size]
        config = getattr(transformers, config_name)(
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=d["num_attention_heads"],
            max_position_embeddings=1024,
        )
        if attention is not None:
            config._attn_implementation = attention
        return _lm(size, getattr(transformers, model_name)(config), config.vocab_size)

    return build


def _t5(size: str, attention: str | None) -> Built:
    import transformers

    d = _LM[size]
    config = transformers.T5Config(
        vocab_size=d["vocab_size"],
        d_model=d["hidden_size"],
        d_ff=d["intermediate_size"],
        d_kv=d["hidden_size"] // d["num_attention_heads"],
        num_layers=d["num_hidden_layers"],
        num_heads=d["num_attention_heads"],
        decoder_start_token_id=0,
        pad_token_id=0,
    )
    return _lm(size, transformers.T5ForConditionalGeneration(config), d["vocab_size"])


def _bart(size: str, attention: str | None) -> Built:
    import transformers

    d = _LM[size]
    layers, heads, ffn = d["num_hidden_layers"], d["num_attention_heads"], d["intermediate_size"]
    config = transformers.BartConfig(
        vocab_size=d["vocab_size"],
        d_model=d["hidden_size"],
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=ffn,
        decoder_ffn_dim=ffn,
        max_position_embeddings=1024,
    )
    if attention is not None:
        config._attn_implementation = attention
    return _lm(size, transformers.BartForConditionalGeneration(config), d["vocab_size"])


def _whisper(size: str, attention: str | None) -> Built:
    import torch
    import transformers

    d = _LM[size]
    frames = 3000 if size == "bench" else 64
    config = transformers.WhisperConfig(
        vocab_size=d["vocab_size"],
        d_model=d["hidden_size"],
        encoder_layers=d["num_hidden_layers"],
        decoder_layers=d["num_hidden_layers"],
        encoder_attention_heads=d["num_attention_heads"],
        decoder_attention_heads=d["num_attention_heads"],
        encoder_ffn_dim=d["intermediate_size"],
        decoder_ffn_dim=d["intermediate_size"],
        num_mel_bins=80,
        max_source_positions=frames // 2,
        max_target_positions=448,
        decoder_start_token_id=1,
        pad_token_id=0,
    )
    if attention is not None:
        config._attn_implementation = attention
    model = transformers.WhisperForConditionalGeneration(config)
    tokens = 64 if size == "bench" else 16

    def make(n: int) -> Any:
        return torch.randn(n, 80, frames), torch.randint(2, d["vocab_size"], (n, tokens))

    def loss(m: Any, b: Any) -> Any:
        return m(input_features=b[0], labels=b[1]).loss

    return Built(model, make(_TOKENS[size][0]), loss, make)


def _classifier(config_name: str, model_name: str, tiny: dict[str, Any], bench: dict[str, Any]):
    """An image classifier from transformers, trained with cross-entropy on 10 classes."""

    def build(size: str, attention: str | None) -> Built:
        import torch
        import transformers

        batch, side = _IMAGES[size]
        dims = {"num_labels": 10, **(tiny if size == "tiny" else bench)}
        config = getattr(transformers, config_name)(**dims)
        if attention is not None:
            config._attn_implementation = attention
        model = getattr(transformers, model_name)(config)

        def make(n: int) -> Any:
            return torch.randn(n, 3, side, side), torch.randint(0, 10, (n,))

        def loss(m: Any, b: Any) -> Any:
            return m(pixel_values=b[0], labels=b[1]).loss

        return Built(model, make(batch), loss, make)

    return build


def _clip(size: str, attention: str | None) -> Built:
    import torch
    import transformers

    batch, side = _IMAGES[size]
    d = _LM[size]
    text = dict(
        vocab_size=d["vocab_size"],
        hidden_size=d["hidden_size"] // 2,
        intermediate_size=d["intermediate_size"] // 2,
        num_hidden_layers=d["num_hidden_layers"],
        num_attention_heads=d["num_attention_heads"] // 2,
        max_position_embeddings=77,
    )
    vision = dict(
        hidden_size=d["hidden_size"] // 2 if size == "tiny" else 768,
        intermediate_size=d["intermediate_size"] // 2 if size == "tiny" else 3072,
        num_hidden_layers=d["num_hidden_layers"] if size == "tiny" else 12,
        num_attention_heads=d["num_attention_heads"] // 2 if size == "tiny" else 12,
        image_size=side,
        patch_size=8 if size == "tiny" else 16,
    )
    config = transformers.CLIPConfig(text_config=text, vision_config=vision, projection_dim=64)
    if attention is not None:
        config._attn_implementation = attention
    model = transformers.CLIPModel(config)
    tokens = 16 if size == "tiny" else 77

    def make(n: int) -> Any:
        return torch.randint(1, d["vocab_size"], (n, tokens)), torch.randn(n, 3, side, side)

    def loss(m: Any, b: Any) -> Any:
        return m(input_ids=b[0], pixel_values=b[1], return_loss=True).loss

    return Built(model, make(batch), loss, make)


def _llava(size: str, attention: str | None) -> Built:
    import torch
    import transformers

    d = _LM[size]
    side, patch = (32, 8) if size == "tiny" else (336, 14)
    vision = transformers.CLIPVisionConfig(
        hidden_size=d["hidden_size"],
        intermediate_size=d["intermediate_size"],
        num_hidden_layers=d["num_hidden_layers"],
        num_attention_heads=d["num_attention_heads"],
        image_size=side,
        patch_size=patch,
    )
    text = transformers.LlamaConfig(**{**d, "vocab_size": d["vocab_size"] + 1})
    config = transformers.LlavaConfig(
        vision_config=vision, text_config=text, image_token_id=d["vocab_size"]
    )
    if attention is not None:
        config._attn_implementation = attention
    model = transformers.LlavaForConditionalGeneration(config)
    images = (side // patch) ** 2  # the CLS feature is dropped ("default" strategy)
    batch, tokens = _TOKENS[size]

    def make(n: int) -> Any:
        ids = torch.randint(1, d["vocab_size"], (n, tokens))
        ids = torch.cat([torch.full((n, images), d["vocab_size"]), ids], dim=1)
        return ids, torch.randn(n, 3, side, side)

    def loss(m: Any, b: Any) -> Any:
        return m(input_ids=b[0], pixel_values=b[1], labels=b[0]).loss

    return Built(model, make(batch), loss, make)


def _torchvision(name: str) -> Callable[..., Built]:
    def build(size: str, attention: str | None) -> Built:
        import torch
        import torchvision

        batch, side = _IMAGES[size]
        model = getattr(torchvision.models, name)(num_classes=10)

        def make(n: int) -> Any:
            return torch.randn(n, 3, side, side), torch.randint(0, 10, (n,))

        return Built(model, make(batch), _image_loss, make)

    return build


def _timm(name: str) -> Callable[..., Built]:
    def build(size: str, attention: str | None) -> Built:
        import timm
        import torch

        batch, side = _IMAGES[size]
        model = timm.create_model(name, pretrained=False, num_classes=10)

        def make(n: int) -> Any:
            return torch.randn(n, 3, side, side), torch.randint(0, 10, (n,))

        return Built(model, make(batch), _image_loss, make)

    return build


def _image_loss(m: Any, b: Any) -> Any:
    import torch

    return torch.nn.functional.cross_entropy(m(b[0]), b[1])


def _unet(size: str, attention: str | None) -> Built:
    import diffusers
    import torch

    tiny = size == "tiny"
    model = diffusers.UNet2DConditionModel(
        sample_size=8 if tiny else 64,
        in_channels=4,
        out_channels=4,
        block_out_channels=(32, 64) if tiny else (320, 640, 1280),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D")
        if tiny
        else ("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D")
        if tiny
        else ("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32 if tiny else 768,
        layers_per_block=1 if tiny else 2,
        attention_head_dim=8,
        norm_num_groups=16 if tiny else 32,
    )
    side, words = (8, 8) if tiny else (64, 77)
    dim = 32 if tiny else 768

    def make(n: int) -> Any:
        return (
            torch.randn(n, 4, side, side),
            torch.randint(0, 1000, (n,)),
            torch.randn(n, words, dim),
        )

    def loss(m: Any, b: Any) -> Any:
        return torch.nn.functional.mse_loss(m(b[0], b[1], encoder_hidden_states=b[2]).sample, b[0])

    return Built(model, make(2 if tiny else 8), loss, make)


def _dit(size: str, attention: str | None) -> Built:
    import diffusers
    import torch

    tiny = size == "tiny"
    model = diffusers.DiTTransformer2DModel(
        num_attention_heads=4 if tiny else 16,
        attention_head_dim=16 if tiny else 72,
        in_channels=4,
        num_layers=2 if tiny else 12,
        sample_size=8 if tiny else 32,
        patch_size=2,
        num_embeds_ada_norm=1000,
    )
    side = 8 if tiny else 32

    def make(n: int) -> Any:
        return (
            torch.randn(n, 4, side, side),
            torch.randint(0, 1000, (n,)),
            torch.randint(0, 1000, (n,)),
        )

    def loss(m: Any, b: Any) -> Any:
        out = m(b[0], timestep=b[1], class_labels=b[2]).sample
        return torch.nn.functional.mse_loss(out[:, :4], b[0])

    return Built(model, make(2 if tiny else 16), loss, make)


def _with_lora(built: Built) -> Built:
    """The model with LoRA adapters (r=16) on every linear layer, the rest frozen."""
    import peft

    lora = peft.LoraConfig(r=16, lora_alpha=32, target_modules="all-linear")
    return Built(peft.get_peft_model(built.model, lora), built.batch, built.loss, built.make_batch)


_GEMMA = {"all": dict(head_dim=16), "bench": dict(head_dim=64, sliding_window=256)}
FAMILIES: dict[str, Callable[[str, str | None], Built]] = {
    "llama": _decoder("LlamaConfig", "LlamaForCausalLM"),
    "mistral": _decoder("MistralConfig", "MistralForCausalLM", bench=dict(sliding_window=256)),
    "qwen2-tied": _decoder("Qwen2Config", "Qwen2ForCausalLM", all=dict(tie_word_embeddings=True)),
    "qwen3": _decoder("Qwen3Config", "Qwen3ForCausalLM", all=dict(tie_word_embeddings=False)),
    "gemma2": _decoder("Gemma2Config", "Gemma2ForCausalLM", **_GEMMA),
    "phi3": _decoder("Phi3Config", "Phi3ForCausalLM", all=dict(pad_token_id=0)),
    "gpt-neox": _neox,
    "falcon": _falcon,
    "opt": _opt,
    "gpt2": _gpt2,
    "mixtral": _decoder(
        "MixtralConfig",
        "MixtralForCausalLM",
        all=dict(num_local_experts=4, num_experts_per_tok=2),
        bench=dict(intermediate_size=1408, num_local_experts=8),
    ),
    "qwen2-moe": _decoder(
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        all=dict(num_experts=4, num_experts_per_tok=2),
        tiny=dict(moe_intermediate_size=64, shared_expert_intermediate_size=64),
        bench=dict(moe_intermediate_size=704, shared_expert_intermediate_size=1408, num_experts=8),
    ),
    "mamba": _mamba,
    "bert": _masked("BertConfig", "BertForMaskedLM"),
    "roberta": _masked("RobertaConfig", "RobertaForMaskedLM"),
    "deberta-v3": _masked("DebertaV2Config", "DebertaV2ForMaskedLM"),
    "t5": _t5,
    "bart": _bart,
    "whisper": _whisper,
    "vit": _classifier(
        "ViTConfig",
        "ViTForImageClassification",
        tiny=dict(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            image_size=32,
            patch_size=8,
        ),
        bench=dict(),
    ),
    "swin": _classifier(
        "SwinConfig",
        "SwinForImageClassification",
        tiny=dict(
            embed_dim=16,
            depths=[1, 1],
            num_heads=[2, 4],
            image_size=32,
            patch_size=4,
            window_size=4,
        ),
        bench=dict(),
    ),
    "convnext": _classifier(
        "ConvNextConfig",
        "ConvNextForImageClassification",
        tiny=dict(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2),
        bench=dict(),
    ),
    "resnet": _classifier(
        "ResNetConfig",
        "ResNetForImageClassification",
        tiny=dict(hidden_sizes=[16, 32], depths=[1, 1], embedding_size=16),
        bench=dict(),
    ),
    "efficientnet": _classifier(
        "EfficientNetConfig",
        "EfficientNetForImageClassification",
        tiny=dict(width_coefficient=0.25, depth_coefficient=0.25, hidden_dim=320, image_size=32),
        bench=dict(width_coefficient=1.0, depth_coefficient=1.0, hidden_dim=1280, image_size=224),
    ),
    "clip": _clip,
    "llava": _llava,
    "tv-resnet50": _torchvision("resnet50"),
    "tv-efficientnet-b0": _torchvision("efficientnet_b0"),
    "tv-convnext-tiny": _torchvision("convnext_tiny"),
    "timm-efficientnet-b0": _timm("efficientnet_b0"),
    "unet": _unet,
    "dit": _dit,
}

_TV = ("torchvision",)
_GREEDY = {"do_sample": False}
CASES: tuple[Case, ...] = (
    # decoder LMs: full fine-tuning in bf16 autocast, fp32, LoRA on bf16 weights
    Case("llama-bf16-autocast", "llama", "train", "bf16-autocast", attention="sdpa"),
    Case("llama-eager-fp32", "llama", "train", attention="eager"),
    Case("llama-lora", "llama", "lora", dtype="bfloat16", attention="sdpa", needs=("peft",)),
    Case("mistral-lora", "mistral", "lora", dtype="bfloat16", attention="sdpa", needs=("peft",)),
    Case("qwen2-tied-bf16-autocast", "qwen2-tied", "train", "bf16-autocast", attention="sdpa"),
    Case("qwen3-bf16-autocast", "qwen3", "train", "bf16-autocast", attention="sdpa"),
    Case("gemma2-bf16-autocast", "gemma2", "train", "bf16-autocast", attention="eager"),
    Case("phi3-bf16-autocast", "phi3", "train", "bf16-autocast", attention="sdpa"),
    Case("gpt-neox-bf16-autocast", "gpt-neox", "train", "bf16-autocast", attention="sdpa"),
    Case("falcon-bf16-autocast", "falcon", "train", "bf16-autocast", attention="sdpa"),
    Case("opt-bf16-autocast", "opt", "train", "bf16-autocast", attention="sdpa"),
    Case("gpt2-fp32", "gpt2", "train", attention="sdpa"),
    Case("mixtral-bf16-autocast", "mixtral", "train", "bf16-autocast", attention="sdpa"),
    Case("qwen2-moe-bf16-autocast", "qwen2-moe", "train", "bf16-autocast", attention="sdpa"),
    Case("mamba-fp32", "mamba", "train"),
    # encoders and encoder-decoders
    Case("bert-fp32", "bert", "train", attention="sdpa"),
    Case("roberta-bf16-autocast", "roberta", "train", "bf16-autocast", attention="sdpa"),
    Case("deberta-v3-bf16-autocast", "deberta-v3", "train", "bf16-autocast"),
    Case("t5-bf16-autocast", "t5", "train", "bf16-autocast"),
    Case("bart-bf16-autocast", "bart", "train", "bf16-autocast", attention="sdpa"),
    Case("whisper-bf16-autocast", "whisper", "train", "bf16-autocast", attention="sdpa"),
    # vision and multimodal
    Case("vit-bf16-autocast", "vit", "train", "bf16-autocast", attention="sdpa"),
    Case("swin-fp32", "swin", "train"),
    Case("convnext-bf16-autocast", "convnext", "train", "bf16-autocast"),
    Case("resnet-fp32", "resnet", "train"),
    Case("efficientnet-fp32", "efficientnet", "train"),
    Case("clip-bf16-autocast", "clip", "train", "bf16-autocast", attention="sdpa"),
    Case("llava-lora", "llava", "lora", dtype="bfloat16", attention="sdpa", needs=("peft",)),
    Case("tv-resnet50-fp32", "tv-resnet50", "train", needs=_TV),
    Case(
        "tv-efficientnet-b0-bf16-autocast",
        "tv-efficientnet-b0",
        "train",
        "bf16-autocast",
        needs=_TV,
    ),
    Case("tv-convnext-tiny-fp32", "tv-convnext-tiny", "train", needs=_TV),
    Case("timm-efficientnet-b0-fp32", "timm-efficientnet-b0", "train", needs=("timm", *_TV)),
    Case("unet-bf16-autocast", "unet", "train", "bf16-autocast", needs=("diffusers",)),
    Case("dit-bf16-autocast", "dit", "train", "bf16-autocast", needs=("diffusers",)),
    # inference
    Case("llama-inference", "llama", "inference", dtype="bfloat16", attention="sdpa"),
    Case("bert-inference", "bert", "inference", dtype="bfloat16", attention="sdpa"),
    # generate: every cache, sampling and beam search
    Case(
        "llama-generate-dynamic",
        "llama",
        "generate",
        dtype="bfloat16",
        attention="sdpa",
        generate=_GREEDY,
    ),
    Case(
        "llama-generate-static-eager",
        "llama",
        "generate",
        dtype="bfloat16",
        attention="sdpa",
        generate={**_GREEDY, "cache_implementation": "static", "disable_compile": True},
    ),
    Case(
        "llama-generate-static-compiled",
        "llama",
        "generate",
        dtype="bfloat16",
        attention="sdpa",
        generate={**_GREEDY, "cache_implementation": "static"},
    ),
    Case(
        "qwen2-tied-generate-sample",
        "qwen2-tied",
        "generate",
        dtype="bfloat16",
        attention="sdpa",
        generate={"do_sample": True, "top_k": 50},
    ),
    Case(
        "gpt2-generate-beam",
        "gpt2",
        "generate",
        dtype="bfloat16",
        attention="sdpa",
        generate={"do_sample": False, "num_beams": 4},
    ),
    Case(
        "gemma2-generate-dynamic",
        "gemma2",
        "generate",
        dtype="bfloat16",
        attention="eager",
        generate=_GREEDY,
    ),
    Case(
        "mixtral-generate-dynamic",
        "mixtral",
        "generate",
        dtype="bfloat16",
        attention="sdpa",
        generate=_GREEDY,
    ),
    Case(
        "opt-generate-dynamic",
        "opt",
        "generate",
        dtype="bfloat16",
        attention="sdpa",
        generate=_GREEDY,
    ),
)

# (batch, prompt, new tokens) of a generate row
GENERATE = {"tiny": (2, 16, 120), "bench": (8, 256, 128)}


def case(name: str) -> Case:
    for c in CASES:
        if c.name == name:
            return c
    raise KeyError(f"no zoo case {name!r}; the cases: {', '.join(c.name for c in CASES)}")
