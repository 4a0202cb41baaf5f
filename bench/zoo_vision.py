"""The zoo's vision, multimodal and diffusion families: transformers' classifiers, CLIP and a
LLaVA-style model, torchvision, timm, and diffusers' UNet and DiT.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from zoo_shapes import IMAGES, LM, TOKENS, Built


def _classifier(config_name: str, model_name: str, tiny: dict[str, Any], bench: dict[str, Any]):
    """An image classifier from transformers, trained with cross-entropy on 10 classes."""

    def build(size: str, attention: str | None) -> Built:
        import torch
        import transformers

        batch, side = IMAGES[size]
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

    batch, side = IMAGES[size]
    d = LM[size]
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

    d = LM[size]
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
    batch, tokens = TOKENS[size]

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

        batch, side = IMAGES[size]
        model = getattr(torchvision.models, name)(num_classes=10)

        def make(n: int) -> Any:
            return torch.randn(n, 3, side, side), torch.randint(0, 10, (n,))

        return Built(model, make(batch), _image_loss, make)

    return build


def _timm(name: str) -> Callable[..., Built]:
    def build(size: str, attention: str | None) -> Built:
        import timm
        import torch

        batch, side = IMAGES[size]
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


FAMILIES: dict[str, Callable[[str, str | None], Built]] = {
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
