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

import zoo_language
import zoo_vision
from zoo_shapes import SIZES, Built

FAMILIES: dict[str, Callable[[str, str | None], Built]] = {
    **zoo_language.FAMILIES,
    **zoo_vision.FAMILIES,
}


@dataclass(frozen=True)
class Case:
    """One row of the zoo: a family under one workload."""

    name: str
    family: str
    workload: str  # "train", "lora", "inference" or "generate"
    precision: str | None = None  # the row's Config precision (None: as built)
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


def _with_lora(built: Built) -> Built:
    """The model with LoRA adapters (r=16) on every linear layer, the rest frozen."""
    import peft

    lora = peft.LoraConfig(r=16, lora_alpha=32, target_modules="all-linear")
    return Built(peft.get_peft_model(built.model, lora), built.batch, built.loss, built.make_batch)


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
        "qwen2-tied-generate-static-compiled",
        "qwen2-tied",
        "generate",
        dtype="bfloat16",
        attention="sdpa",
        generate={**_GREEDY, "cache_implementation": "static"},
    ),
    Case(
        "gemma2-generate-static-compiled",
        "gemma2",
        "generate",
        dtype="bfloat16",
        attention="eager",
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


def first_of_each_family(*, generate: bool = False) -> list[Case]:
    """The first case of each family, and with ``generate`` every ``generate`` case too (one a
    cache): what the GPU tests run."""
    seen: set[str] = set()
    chosen = []
    for c in CASES:
        if c.workload == "generate":
            if not generate:
                continue
        elif c.family in seen:
            continue
        seen.add(c.family)
        chosen.append(c)
    return chosen


def case(name: str) -> Case:
    for c in CASES:
        if c.name == name:
            return c
    raise KeyError(f"no zoo case {name!r}; the cases: {', '.join(c.name for c in CASES)}")
