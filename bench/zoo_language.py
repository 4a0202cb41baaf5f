"""The zoo's language families: decoders (dense, mixture of experts, state space), encoders,
encoder-decoders and speech, from transformers' configs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from zoo_shapes import LM, TOKENS, Built, lm


def _decoder(config_name: str, model_name: str, **overrides: Any) -> Callable[..., Built]:
    """A decoder family from transformers' ``config_name`` and ``model_name`` classes."""

    def build(size: str, attention: str | None) -> Built:
        import transformers

        dims = {**LM[size], **overrides.get(size, {}), **overrides.get("all", {})}
        config = getattr(transformers, config_name)(**dims)
        if attention is not None:
            config._attn_implementation = attention
        model = getattr(transformers, model_name)(config)
        return lm(size, model, config.vocab_size)

    return build


def _family(
    config_name: str, model_name: str, dims: Callable[[dict[str, Any]], dict[str, Any]]
) -> Callable[..., Built]:
    """A language model trained on its inputs as labels: transformers' ``config_name`` made by
    ``dims`` from the size's shared dimensions, and ``model_name`` built from it."""

    def build(size: str, attention: str | None) -> Built:
        import transformers

        config = getattr(transformers, config_name)(**dims(LM[size]))
        if attention is not None:
            config._attn_implementation = attention
        return lm(size, getattr(transformers, model_name)(config), config.vocab_size)

    return build


def _same(d: dict[str, Any], *names: str) -> dict[str, Any]:
    return {name: d[name] for name in names}


def _gpt2(d: dict[str, Any]) -> dict[str, Any]:
    return dict(
        vocab_size=d["vocab_size"], n_embd=d["hidden_size"], n_layer=d["num_hidden_layers"],
        n_head=d["num_attention_heads"], n_positions=d["max_position_embeddings"],
    )  # fmt: skip


def _opt(d: dict[str, Any]) -> dict[str, Any]:
    return dict(
        **_same(d, "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "max_position_embeddings"),
        ffn_dim=d["intermediate_size"], word_embed_proj_dim=d["hidden_size"],
    )  # fmt: skip


def _falcon(d: dict[str, Any]) -> dict[str, Any]:
    return dict(
        **_same(d, "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"),
        num_kv_heads=d["num_key_value_heads"], new_decoder_architecture=True,
    )  # fmt: skip


def _neox(d: dict[str, Any]) -> dict[str, Any]:
    return _same(
        d, "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "max_position_embeddings",
    )  # fmt: skip


def _mamba(d: dict[str, Any]) -> dict[str, Any]:
    return dict(
        vocab_size=d["vocab_size"], hidden_size=d["hidden_size"] // 2,
        num_hidden_layers=d["num_hidden_layers"], state_size=16,
    )  # fmt: skip


def _encoder(d: dict[str, Any]) -> dict[str, Any]:
    return dict(
        **_same(d, "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads"),
        max_position_embeddings=1024,
    )  # fmt: skip


def _t5(d: dict[str, Any]) -> dict[str, Any]:
    return dict(
        vocab_size=d["vocab_size"], d_model=d["hidden_size"], d_ff=d["intermediate_size"],
        d_kv=d["hidden_size"] // d["num_attention_heads"], num_layers=d["num_hidden_layers"],
        num_heads=d["num_attention_heads"], decoder_start_token_id=0, pad_token_id=0,
    )  # fmt: skip


def _bart(d: dict[str, Any]) -> dict[str, Any]:
    layers, heads, ffn = d["num_hidden_layers"], d["num_attention_heads"], d["intermediate_size"]
    return dict(
        vocab_size=d["vocab_size"], d_model=d["hidden_size"], encoder_layers=layers,
        decoder_layers=layers, encoder_attention_heads=heads, decoder_attention_heads=heads,
        encoder_ffn_dim=ffn, decoder_ffn_dim=ffn, max_position_embeddings=1024,
    )  # fmt: skip


def _whisper(size: str, attention: str | None) -> Built:
    import torch
    import transformers

    d = LM[size]
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

    return Built(model, make(TOKENS[size][0]), loss, make)


_GEMMA = {"all": dict(head_dim=16), "bench": dict(head_dim=64, sliding_window=256)}
FAMILIES: dict[str, Callable[[str, str | None], Built]] = {
    "llama": _decoder("LlamaConfig", "LlamaForCausalLM"),
    "mistral": _decoder("MistralConfig", "MistralForCausalLM", bench=dict(sliding_window=256)),
    "qwen2-tied": _decoder("Qwen2Config", "Qwen2ForCausalLM", all=dict(tie_word_embeddings=True)),
    "qwen3": _decoder("Qwen3Config", "Qwen3ForCausalLM", all=dict(tie_word_embeddings=False)),
    "gemma2": _decoder("Gemma2Config", "Gemma2ForCausalLM", **_GEMMA),
    "phi3": _decoder("Phi3Config", "Phi3ForCausalLM", all=dict(pad_token_id=0)),
    "gpt-neox": _family("GPTNeoXConfig", "GPTNeoXForCausalLM", _neox),
    "falcon": _family("FalconConfig", "FalconForCausalLM", _falcon),
    "opt": _family("OPTConfig", "OPTForCausalLM", _opt),
    "gpt2": _family("GPT2Config", "GPT2LMHeadModel", _gpt2),
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
    "mamba": _family("MambaConfig", "MambaForCausalLM", _mamba),
    "bert": _family("BertConfig", "BertForMaskedLM", _encoder),
    "roberta": _family("RobertaConfig", "RobertaForMaskedLM", _encoder),
    "deberta-v3": _family("DebertaV2Config", "DebertaV2ForMaskedLM", _encoder),
    "t5": _family("T5Config", "T5ForConditionalGeneration", _t5),
    "bart": _family("BartConfig", "BartForConditionalGeneration", _bart),
    "whisper": _whisper,
}
