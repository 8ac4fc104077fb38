"""The breadth suite: real architectures at tiny size, built from configs (random weights, no download).

`MODELS` maps a name to a builder that returns `(model, inputs, kind)`: `model` in eval mode,
`inputs` a dict of keyword arguments, `kind` one of "decoder" (a causal LM: also run with
`use_cache=True`), "encoder", "seq2seq", "vision" (text+vision pairs too), "audio", "torch". Every builder seeds torch,
so the same name always gives the same weights and inputs. Used by `breaks.py --models` (the
table of graphs / breaks / frames in Python per model, against torch.compile) and by the CI test
`tests/e2e/test_breadth.py` over a fast subset. `WIDER` (breadth24) holds more architectures of
other code (mixtures of experts, state-space hybrids, FFT / hashing / landmark attention, codecs,
time series) outside CI: `breadth_compile.py --suite wider`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from breadth_programs import PROGRAMS  # type: ignore[import-not-found]
from torch import nn

H, LAYERS, HEADS, FFN, VOCAB, BATCH, SEQ = 32, 2, 4, 64, 96, 2, 8
Built = tuple[nn.Module, dict[str, Any], str]


def _ids(vocab: int = VOCAB, seq: int = SEQ) -> torch.Tensor:
    return torch.randint(0, vocab, (BATCH, seq), generator=torch.Generator().manual_seed(1))


def _image(size: int = 32, channels: int = 3) -> torch.Tensor:
    return torch.randn(BATCH, channels, size, size, generator=torch.Generator().manual_seed(2))


def _text(cls_name: str, cfg_name: str, kind: str = "encoder", **cfg: Any) -> Callable[[], Built]:
    def build() -> Built:
        import transformers

        torch.manual_seed(0)
        config = getattr(transformers, cfg_name)(**cfg)
        model = getattr(transformers, cls_name)(config).eval()
        return model, {"input_ids": _ids()}, kind

    return build


def _vision(cls_name: str, cfg_name: str, size: int = 32, **cfg: Any) -> Callable[[], Built]:
    def build() -> Built:
        import transformers

        torch.manual_seed(0)
        config = getattr(transformers, cfg_name)(**cfg)
        model = getattr(transformers, cls_name)(config).eval()
        return model, {"pixel_values": _image(size)}, "vision"

    return build


_BERTISH = {
    "hidden_size": H,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": HEADS,
    "intermediate_size": FFN,
    "vocab_size": VOCAB,
    "max_position_embeddings": 64,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
}
_LLAMAISH = {
    "hidden_size": H,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": HEADS,
    "num_key_value_heads": 2,  # grouped-query attention
    "intermediate_size": FFN,
    "vocab_size": VOCAB,
    "max_position_embeddings": 64,
}
_VIT = {
    "image_size": 32,
    "patch_size": 8,
    "hidden_size": H,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": HEADS,
    "intermediate_size": FFN,
    "num_labels": 10,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
}


def _bart() -> Built:
    import transformers

    torch.manual_seed(0)
    cfg = transformers.BartConfig(
        d_model=H, encoder_layers=LAYERS, decoder_layers=LAYERS, encoder_attention_heads=HEADS,
        decoder_attention_heads=HEADS, encoder_ffn_dim=FFN, decoder_ffn_dim=FFN, vocab_size=VOCAB,
        max_position_embeddings=64, dropout=0.0, attention_dropout=0.0,
    )  # fmt: skip
    model = transformers.BartForConditionalGeneration(cfg).eval()
    return model, {"input_ids": _ids(), "decoder_input_ids": _ids(seq=5)}, "seq2seq"


def _pegasus() -> Built:
    import transformers

    torch.manual_seed(0)
    cfg = transformers.PegasusConfig(
        d_model=H, encoder_layers=LAYERS, decoder_layers=LAYERS, encoder_attention_heads=HEADS,
        decoder_attention_heads=HEADS, encoder_ffn_dim=FFN, decoder_ffn_dim=FFN, vocab_size=VOCAB,
        max_position_embeddings=64, dropout=0.0, attention_dropout=0.0, pad_token_id=0,
        decoder_start_token_id=0,
    )  # fmt: skip
    model = transformers.PegasusForConditionalGeneration(cfg).eval()
    return model, {"input_ids": _ids(), "decoder_input_ids": _ids(seq=5)}, "seq2seq"


def _t5() -> Built:
    import transformers

    torch.manual_seed(0)
    cfg = transformers.T5Config(
        d_model=H, d_ff=FFN, d_kv=8, num_layers=LAYERS, num_heads=HEADS, vocab_size=VOCAB, dropout_rate=0.0
    )
    model = transformers.T5ForConditionalGeneration(cfg).eval()
    return model, {"input_ids": _ids(), "decoder_input_ids": _ids(seq=5)}, "seq2seq"


def _whisper_config() -> Any:
    """The tiny Whisper both rows build (the encoder alone, and encoder and decoder)."""
    import transformers

    return transformers.WhisperConfig(
        d_model=H, encoder_layers=LAYERS, decoder_layers=LAYERS, encoder_attention_heads=HEADS,
        decoder_attention_heads=HEADS, encoder_ffn_dim=FFN, decoder_ffn_dim=FFN, vocab_size=VOCAB,
        num_mel_bins=16, max_source_positions=16, max_target_positions=16, dropout=0.0, pad_token_id=0,
        bos_token_id=1, eos_token_id=2, decoder_start_token_id=3,
    )  # fmt: skip


def _whisper_encoder() -> Built:
    import transformers

    torch.manual_seed(0)
    cfg = _whisper_config()
    model = transformers.WhisperModel(cfg).get_encoder().eval()
    feats = torch.randn(BATCH, 16, 32, generator=torch.Generator().manual_seed(2))
    return model, {"input_features": feats}, "audio"


def _wav2vec2() -> Built:
    import transformers

    torch.manual_seed(0)
    cfg = transformers.Wav2Vec2Config(
        hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=FFN,
        conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4, vocab_size=VOCAB, hidden_dropout=0.0, attention_dropout=0.0,
        activation_dropout=0.0, feat_proj_dropout=0.0, layerdrop=0.0, mask_time_prob=0.0,
    )  # fmt: skip
    model = transformers.Wav2Vec2ForCTC(cfg).eval()
    return (
        model,
        {"input_values": torch.randn(BATCH, 400, generator=torch.Generator().manual_seed(2))},
        "audio",
    )


def _clip_text() -> Built:
    import transformers

    torch.manual_seed(0)
    cfg = transformers.CLIPTextConfig(
        hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=FFN,
        vocab_size=VOCAB, max_position_embeddings=SEQ,
    )  # fmt: skip
    return transformers.CLIPTextModel(cfg).eval(), {"input_ids": _ids()}, "encoder"


def _segformer() -> Built:
    import transformers

    torch.manual_seed(0)
    cfg = transformers.SegformerConfig(
        num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32], patch_sizes=[7, 3],
        strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2], decoder_hidden_size=32, num_labels=5,
    )  # fmt: skip
    return transformers.SegformerForSemanticSegmentation(cfg).eval(), {"pixel_values": _image(32)}, "vision"


def _swin() -> Built:
    import transformers

    torch.manual_seed(0)
    cfg = transformers.SwinConfig(
        image_size=32,
        patch_size=2,
        embed_dim=16,
        depths=[1, 1],
        num_heads=[2, 4],
        window_size=4,
        num_labels=10,
    )
    return transformers.SwinForImageClassification(cfg).eval(), {"pixel_values": _image(32)}, "vision"


def _cnn(cls_name: str, cfg_name: str, **cfg: Any) -> Callable[[], Built]:
    return _vision(cls_name, cfg_name, num_labels=10, **cfg)


def _s2s(cls_name: str, cfg_name: str, **extra: Any) -> Callable[[], Built]:
    """An encoder-decoder LM of the BART family (mBART, Marian, Blenderbot, M2M100, LED)."""

    def build() -> Built:
        import transformers

        torch.manual_seed(0)
        cfg = getattr(transformers, cfg_name)(
            d_model=H, encoder_layers=LAYERS, decoder_layers=LAYERS, encoder_attention_heads=HEADS,
            decoder_attention_heads=HEADS, encoder_ffn_dim=FFN, decoder_ffn_dim=FFN, vocab_size=VOCAB,
            dropout=0.0, attention_dropout=0.0, pad_token_id=0, decoder_start_token_id=0, **extra,
        )  # fmt: skip
        model = getattr(transformers, cls_name)(cfg).eval()
        return model, {"input_ids": _ids(), "decoder_input_ids": _ids(seq=5)}, "seq2seq"

    return build


def _whisper() -> Built:
    import transformers

    torch.manual_seed(0)
    cfg = _whisper_config()
    model = transformers.WhisperForConditionalGeneration(cfg).eval()
    feats = torch.randn(BATCH, 16, 32, generator=torch.Generator().manual_seed(2))
    return model, {"input_features": feats, "decoder_input_ids": _ids(seq=5)}, "seq2seq"


def _wav(cls_name: str, cfg_name: str) -> Callable[[], Built]:
    """A wav2vec2-style speech encoder with a CTC head (HuBERT, WavLM, Data2VecAudio)."""

    def build() -> Built:
        import transformers

        torch.manual_seed(0)
        cfg = getattr(transformers, cfg_name)(
            hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=FFN,
            conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=4, vocab_size=VOCAB, hidden_dropout=0.0, attention_dropout=0.0,
            activation_dropout=0.0, feat_proj_dropout=0.0, layerdrop=0.0, mask_time_prob=0.0,
        )  # fmt: skip
        model = getattr(transformers, cls_name)(cfg).eval()
        return (
            model,
            {"input_values": torch.randn(BATCH, 400, generator=torch.Generator().manual_seed(2))},
            "audio",
        )

    return build


_TEXT_TOWER = {"hidden_size": H, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
               "intermediate_size": FFN, "vocab_size": VOCAB, "max_position_embeddings": 64}  # fmt: skip
_VISION_TOWER = {"hidden_size": H, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
                 "intermediate_size": FFN, "image_size": 32, "patch_size": 8}  # fmt: skip


def _pair(cls_name: str, cfg_name: str, **cfg: Any) -> Callable[[], Built]:
    """A text tower and a vision tower scored against each other (CLIP, SigLIP, BLIP)."""

    def build() -> Built:
        import transformers

        torch.manual_seed(0)
        text = {**_TEXT_TOWER, "max_position_embeddings": SEQ} if cfg_name != "BlipConfig" else _TEXT_TOWER
        config = getattr(transformers, cfg_name)(text_config=text, vision_config=_VISION_TOWER, **cfg)
        model = getattr(transformers, cls_name)(config).eval()
        return model, {"input_ids": _ids(), "pixel_values": _image(32)}, "vision"

    return build


def _detr() -> Built:
    import transformers

    torch.manual_seed(0)
    backbone = transformers.ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1], layer_type="basic",
        out_features=["stage4"],
    )  # fmt: skip
    cfg = transformers.DetrConfig(
        use_timm_backbone=False, use_pretrained_backbone=False, backbone=None, backbone_config=backbone,
        d_model=H, encoder_layers=LAYERS, decoder_layers=LAYERS, encoder_attention_heads=HEADS,
        decoder_attention_heads=HEADS, encoder_ffn_dim=FFN, decoder_ffn_dim=FFN, num_queries=6, dropout=0.0,
        attention_dropout=0.0, num_labels=5,
    )  # fmt: skip
    return transformers.DetrForObjectDetection(cfg).eval(), {"pixel_values": _image(64)}, "vision"


def _llava() -> Built:
    """A vision-language model: CLIP's vision tower, a projector, a llama LM; the image's patch
    features replace the image tokens of the prompt."""
    import transformers

    torch.manual_seed(0)
    vision = transformers.CLIPVisionConfig(**_VISION_TOWER)
    cfg = transformers.LlavaConfig(
        vision_config=vision, text_config=transformers.LlamaConfig(**_LLAMAISH), image_token_id=VOCAB - 1,
        projector_hidden_act="gelu", vision_feature_layer=-1,
    )  # fmt: skip
    model = transformers.LlavaForConditionalGeneration(cfg).eval()
    patches = (32 // 8) ** 2
    ids = torch.randint(0, VOCAB - 2, (BATCH, 4 + patches + 3), generator=torch.Generator().manual_seed(1))
    ids[:, 4 : 4 + patches] = VOCAB - 1
    return model, {"input_ids": ids, "pixel_values": _image(32)}, "vision"


class _TorchEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(H, HEADS, FFN, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x)


class _TorchTransformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.model = nn.Transformer(H, HEADS, LAYERS, LAYERS, FFN, dropout=0.0, batch_first=True)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.size(1))
        return self.model(src, tgt, tgt_mask=mask)


class _Rnn(nn.Module):
    def __init__(self, cls: type[nn.Module]) -> None:
        super().__init__()
        self.rnn = cls(H, H, num_layers=2, batch_first=True)
        self.head = nn.Linear(H, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


class _Mha(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(H, HEADS, batch_first=True)
        self.norm = nn.LayerNorm(H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, weights = self.attn(x, x, x)
        return self.norm(out + x) * weights.mean()


class _Recommender(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.user = nn.EmbeddingBag(200, 16, mode="sum")
        self.item = nn.EmbeddingBag(200, 16, mode="mean")
        self.mlp = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, users: torch.Tensor, items: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.mlp(torch.cat([self.user(users, offsets), self.item(items, offsets)], 1)).squeeze(1)


def _torch(make: Callable[[], nn.Module], **inputs: Callable[[], torch.Tensor]) -> Callable[[], Built]:
    def build() -> Built:
        torch.manual_seed(0)
        model = make().eval()
        g = torch.Generator().manual_seed(2)
        return model, {k: v(g) for k, v in inputs.items()}, "torch"  # type: ignore[call-arg]

    return build


def _seq(g: torch.Generator) -> torch.Tensor:
    return torch.randn(BATCH, SEQ, H, generator=g)


def _bags(g: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 200, (32,), generator=g)


MODELS: dict[str, Callable[[], Built]] = {
    # decoder LMs (grouped-query attention where the architecture has it)
    "gpt2": _text("GPT2LMHeadModel", "GPT2Config", "decoder", n_embd=H, n_layer=LAYERS, n_head=HEADS,
                  vocab_size=VOCAB, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    "llama": _text("LlamaForCausalLM", "LlamaConfig", "decoder", **_LLAMAISH),
    "mistral": _text("MistralForCausalLM", "MistralConfig", "decoder", **_LLAMAISH),
    "qwen2": _text("Qwen2ForCausalLM", "Qwen2Config", "decoder", **_LLAMAISH),
    "gemma": _text("GemmaForCausalLM", "GemmaConfig", "decoder", head_dim=8, **_LLAMAISH),
    "phi": _text("PhiForCausalLM", "PhiConfig", "decoder", hidden_size=H, num_hidden_layers=LAYERS,
                 num_attention_heads=HEADS, intermediate_size=FFN, vocab_size=VOCAB, max_position_embeddings=64),
    "falcon": _text("FalconForCausalLM", "FalconConfig", "decoder", hidden_size=H, num_hidden_layers=LAYERS,
                    num_attention_heads=HEADS, vocab_size=VOCAB, hidden_dropout=0.0, attention_dropout=0.0),
    "gpt_neox": _text("GPTNeoXForCausalLM", "GPTNeoXConfig", "decoder", hidden_size=H, num_hidden_layers=LAYERS,
                      num_attention_heads=HEADS, intermediate_size=FFN, vocab_size=VOCAB,
                      max_position_embeddings=64),
    "opt": _text("OPTForCausalLM", "OPTConfig", "decoder", hidden_size=H, num_hidden_layers=LAYERS,
                 num_attention_heads=HEADS, ffn_dim=FFN, vocab_size=VOCAB, word_embed_proj_dim=H,
                 max_position_embeddings=64, dropout=0.0, attention_dropout=0.0),
    "bloom": _text("BloomForCausalLM", "BloomConfig", "decoder", hidden_size=H, n_layer=LAYERS, n_head=HEADS,
                   vocab_size=VOCAB, hidden_dropout=0.0, attention_dropout=0.0),
    "gptj": _text("GPTJForCausalLM", "GPTJConfig", "decoder", n_embd=H, n_layer=LAYERS, n_head=HEADS, rotary_dim=4,
                  vocab_size=VOCAB, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    "stablelm": _text("StableLmForCausalLM", "StableLmConfig", "decoder", partial_rotary_factor=0.5, **_LLAMAISH),
    # added in the thirteenth session: newer decoder LMs, mixture-of-experts, a state-space model
    "qwen3": _text("Qwen3ForCausalLM", "Qwen3Config", "decoder", head_dim=8, **_LLAMAISH),
    "phi3": _text("Phi3ForCausalLM", "Phi3Config", "decoder", pad_token_id=0, **_LLAMAISH),
    "gemma2": _text("Gemma2ForCausalLM", "Gemma2Config", "decoder", head_dim=8, sliding_window=4, **_LLAMAISH),
    "gemma3": _text("Gemma3ForCausalLM", "Gemma3TextConfig", "decoder", head_dim=8, sliding_window=4, **_LLAMAISH),
    "olmo": _text("OlmoForCausalLM", "OlmoConfig", "decoder", **_LLAMAISH),
    "olmo2": _text("Olmo2ForCausalLM", "Olmo2Config", "decoder", **_LLAMAISH),
    "starcoder2": _text("Starcoder2ForCausalLM", "Starcoder2Config", "decoder", **_LLAMAISH),
    "cohere": _text("CohereForCausalLM", "CohereConfig", "decoder", **_LLAMAISH),
    "granite": _text("GraniteForCausalLM", "GraniteConfig", "decoder", **_LLAMAISH),
    "persimmon": _text("PersimmonForCausalLM", "PersimmonConfig", "decoder", hidden_size=H, num_hidden_layers=LAYERS,
                       num_attention_heads=HEADS, intermediate_size=FFN, vocab_size=VOCAB, max_position_embeddings=64,
                       hidden_dropout=0.0, attention_dropout=0.0),
    "mpt": _text("MptForCausalLM", "MptConfig", "decoder", d_model=H, n_heads=HEADS, n_layers=LAYERS, vocab_size=VOCAB,
                 max_seq_len=64),
    "codegen": _text("CodeGenForCausalLM", "CodeGenConfig", "decoder", n_embd=H, n_layer=LAYERS, n_head=HEADS,
                     rotary_dim=4, vocab_size=VOCAB, n_positions=64, n_ctx=64, resid_pdrop=0.0, embd_pdrop=0.0,
                     attn_pdrop=0.0),
    "gpt_bigcode": _text("GPTBigCodeForCausalLM", "GPTBigCodeConfig", "decoder", n_embd=H, n_layer=LAYERS,
                         n_head=HEADS, vocab_size=VOCAB, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                         attn_pdrop=0.0),
    "gpt_neo": _text("GPTNeoForCausalLM", "GPTNeoConfig", "decoder", hidden_size=H, num_layers=LAYERS,
                     num_heads=HEADS, attention_types=[[["global", "local"], 1]], window_size=4, vocab_size=VOCAB,
                     max_position_embeddings=64, intermediate_size=FFN, embed_dropout=0.0, attention_dropout=0.0,
                     resid_dropout=0.0),
    "mixtral": _text("MixtralForCausalLM", "MixtralConfig", "decoder", num_local_experts=4, num_experts_per_tok=2,
                     **_LLAMAISH),
    "qwen2_moe": _text("Qwen2MoeForCausalLM", "Qwen2MoeConfig", "decoder", num_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=16, shared_expert_intermediate_size=32, **_LLAMAISH),
    "mamba": _text("MambaForCausalLM", "MambaConfig", "decoder", hidden_size=H, num_hidden_layers=LAYERS,
                   vocab_size=VOCAB, state_size=8, expand=2, conv_kernel=4),
    "falcon_mamba": _text("FalconMambaForCausalLM", "FalconMambaConfig", "decoder", hidden_size=H,
                          num_hidden_layers=LAYERS, vocab_size=VOCAB, state_size=8, expand=2, conv_kernel=4),
    "mamba2": _text("Mamba2ForCausalLM", "Mamba2Config", "decoder", hidden_size=H, num_hidden_layers=LAYERS,
                    vocab_size=VOCAB, state_size=8, expand=2, conv_kernel=4, num_heads=8, head_dim=8, n_groups=1,
                    chunk_size=4),
    # hybrids: attention with mamba layers (and experts), attention with short convolutions
    "jamba": _text("JambaForCausalLM", "JambaConfig", "decoder", hidden_size=H, num_hidden_layers=LAYERS,
                   num_attention_heads=HEADS, num_key_value_heads=2, intermediate_size=FFN, vocab_size=VOCAB,
                   num_experts=2, num_experts_per_tok=1, expert_layer_period=2, expert_layer_offset=1,
                   attn_layer_period=2, attn_layer_offset=1, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2,
                   mamba_dt_rank=4, use_mamba_kernels=False),
    "lfm2": _text("Lfm2ForCausalLM", "Lfm2Config", "decoder", hidden_size=H, num_hidden_layers=LAYERS,
                  num_attention_heads=HEADS, num_key_value_heads=2, intermediate_size=FFN, vocab_size=VOCAB,
                  max_position_embeddings=64, layer_types=["conv", "full_attention"], conv_L_cache=3),
    # mixtures of experts with latent attention / attention sinks
    "deepseek_v3": _text("DeepseekV3ForCausalLM", "DeepseekV3Config", "decoder", hidden_size=H,
                         num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=HEADS,
                         intermediate_size=FFN, moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2,
                         n_group=2, topk_group=1, first_k_dense_replace=1, kv_lora_rank=8, q_lora_rank=16,
                         qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8, vocab_size=VOCAB,
                         max_position_embeddings=64),
    "gpt_oss": _text("GptOssForCausalLM", "GptOssConfig", "decoder", hidden_size=H, num_hidden_layers=LAYERS,
                     num_attention_heads=HEADS, num_key_value_heads=2, head_dim=8, intermediate_size=FFN,
                     num_local_experts=4, num_experts_per_tok=2, vocab_size=VOCAB, max_position_embeddings=64,
                     sliding_window=4, layer_types=["sliding_attention", "full_attention"]),
    "qwen3_moe": _text("Qwen3MoeForCausalLM", "Qwen3MoeConfig", "decoder", head_dim=8, num_experts=4,
                       num_experts_per_tok=2, moe_intermediate_size=16, **_LLAMAISH),
    # encoder MLMs
    "bert": _text("BertForMaskedLM", "BertConfig", **_BERTISH),
    "roberta": _text("RobertaForMaskedLM", "RobertaConfig", **_BERTISH),
    "xlm_roberta": _text("XLMRobertaForMaskedLM", "XLMRobertaConfig", **_BERTISH),
    "electra": _text("ElectraForMaskedLM", "ElectraConfig", embedding_size=H, **_BERTISH),
    "albert": _text("AlbertForMaskedLM", "AlbertConfig", embedding_size=16, **_BERTISH),
    "deberta_v2": _text("DebertaV2ForMaskedLM", "DebertaV2Config", **_BERTISH),
    "mobilebert": _text("MobileBertForMaskedLM", "MobileBertConfig", embedding_size=16, intra_bottleneck_size=16,
                        true_hidden_size=16, num_feedforward_networks=2,
                        **{**_BERTISH, "num_attention_heads": 2}),
    "squeezebert": _text("SqueezeBertForMaskedLM", "SqueezeBertConfig", embedding_size=H, **_BERTISH),
    "mpnet": _text("MPNetForMaskedLM", "MPNetConfig", **_BERTISH),
    "distilbert": _text("DistilBertForMaskedLM", "DistilBertConfig", dim=H, n_layers=LAYERS, n_heads=HEADS,
                        hidden_dim=FFN, vocab_size=VOCAB, dropout=0.0, attention_dropout=0.0),
    "clip_text": _clip_text,
    "longformer": _text("LongformerModel", "LongformerConfig", attention_window=4, **_BERTISH),
    "funnel": _text("FunnelForMaskedLM", "FunnelConfig", d_model=H, n_head=HEADS, d_head=8, d_inner=FFN,
                    block_sizes=[1, 1], vocab_size=VOCAB, hidden_dropout=0.0, attention_dropout=0.0,
                    activation_dropout=0.0),
    "modernbert": _text("ModernBertForMaskedLM", "ModernBertConfig", hidden_size=H, num_hidden_layers=LAYERS,
                        num_attention_heads=HEADS, intermediate_size=FFN, vocab_size=VOCAB, max_position_embeddings=64,
                        pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2,
                        local_attention=4),
    "deberta": _text("DebertaForMaskedLM", "DebertaConfig", **_BERTISH),
    "roformer": _text("RoFormerForMaskedLM", "RoFormerConfig", embedding_size=H, **_BERTISH),
    "convbert": _text("ConvBertForMaskedLM", "ConvBertConfig", embedding_size=H, **_BERTISH),
    "ernie": _text("ErnieForMaskedLM", "ErnieConfig", **_BERTISH),
    "xlnet": _text("XLNetLMHeadModel", "XLNetConfig", d_model=H, n_layer=LAYERS, n_head=HEADS, d_inner=FFN,
                   vocab_size=VOCAB, dropout=0.0),
    # encoder-decoders, audio
    "bart": _bart,
    "t5": _t5,
    "pegasus": _pegasus,
    "whisper_encoder": _whisper_encoder,
    "wav2vec2": _wav2vec2,
    "mbart": _s2s("MBartForConditionalGeneration", "MBartConfig", max_position_embeddings=64),
    "marian": _s2s("MarianMTModel", "MarianConfig", max_position_embeddings=64),
    "blenderbot": _s2s("BlenderbotForConditionalGeneration", "BlenderbotConfig", max_position_embeddings=64),
    "blenderbot_small": _s2s("BlenderbotSmallForConditionalGeneration", "BlenderbotSmallConfig",
                             max_position_embeddings=64),
    "m2m100": _s2s("M2M100ForConditionalGeneration", "M2M100Config", max_position_embeddings=64),
    "led": _s2s("LEDForConditionalGeneration", "LEDConfig", attention_window=4, max_encoder_position_embeddings=64,
                max_decoder_position_embeddings=64),
    "whisper": _whisper,
    "hubert": _wav("HubertForCTC", "HubertConfig"),
    "wavlm": _wav("WavLMForCTC", "WavLMConfig"),
    "data2vec_audio": _wav("Data2VecAudioForCTC", "Data2VecAudioConfig"),
    # text and vision towers together
    "clip": _pair("CLIPModel", "CLIPConfig", projection_dim=16),
    "siglip": _pair("SiglipModel", "SiglipConfig"),
    "blip": _pair("BlipModel", "BlipConfig", projection_dim=16),
    "llava": _llava,
    # vision transformers, hierarchical/windowed, CNNs, segmentation
    "vit": _vision("ViTForImageClassification", "ViTConfig", **_VIT),
    "deit": _vision("DeiTForImageClassification", "DeiTConfig", **_VIT),
    "beit": _vision("BeitForImageClassification", "BeitConfig", **_VIT),
    "dinov2": _vision("Dinov2ForImageClassification", "Dinov2Config", **{**_VIT, "mlp_ratio": 2}),
    "swin": _swin,
    "convnext_v2": _cnn("ConvNextV2ForImageClassification", "ConvNextV2Config", hidden_sizes=[8, 16, 32, 64],
                        depths=[1, 1, 1, 1]),
    "mobilenet_v2": _cnn("MobileNetV2ForImageClassification", "MobileNetV2Config", depth_multiplier=0.35,
                         image_size=32),
    "efficientnet": _cnn("EfficientNetForImageClassification", "EfficientNetConfig", width_coefficient=0.25,
                         depth_coefficient=0.25, image_size=32, hidden_dim=320),
    "regnet": _cnn("RegNetForImageClassification", "RegNetConfig", embedding_size=8, hidden_sizes=[8, 16, 32, 64],
                   depths=[1, 1, 1, 1], groups_width=8),
    "resnet": _cnn("ResNetForImageClassification", "ResNetConfig", embedding_size=8, hidden_sizes=[8, 16, 32, 64],
                   depths=[1, 1, 1, 1], layer_type="basic"),
    "segformer": _segformer,
    "detr": _detr,
    "yolos": _vision("YolosForObjectDetection", "YolosConfig", image_size=[32, 32], num_detection_tokens=5,
                     **{k: v for k, v in _VIT.items() if k != "image_size"}),
    "dpt": _vision("DPTForDepthEstimation", "DPTConfig", **{**_VIT, "num_hidden_layers": 4,
                   "backbone_out_indices": [0, 1, 2, 3], "neck_hidden_sizes": [8, 8, 16, 16],
                   "fusion_hidden_size": 16, "num_labels": 2}),
    "vit_mae": _vision("ViTMAEModel", "ViTMAEConfig", mask_ratio=0.5, **_VIT),
    "hiera": _vision("HieraForImageClassification", "HieraConfig", image_size=[32, 32], patch_size=[3, 3],
                     patch_stride=[2, 2], patch_padding=[1, 1], embed_dim=16, num_heads=[1, 2], depths=[1, 1],
                     query_stride=[2, 2], masked_unit_size=[4, 4], num_query_pool=1, num_labels=10),
    "swinv2": _vision("Swinv2ForImageClassification", "Swinv2Config", image_size=32, patch_size=2, embed_dim=16,
                      depths=[1, 1], num_heads=[2, 4], window_size=4, num_labels=10),
    "focalnet": _cnn("FocalNetForImageClassification", "FocalNetConfig", image_size=32, embed_dim=16, depths=[1, 1],
                     patch_size=2),
    "cvt": _cnn("CvtForImageClassification", "CvtConfig", embed_dim=[16, 32], num_heads=[1, 2], depth=[1, 2],
                patch_sizes=[7, 3], patch_stride=[4, 2], patch_padding=[2, 1], mlp_ratio=[2.0, 2.0],
                attention_drop_rate=[0.0, 0.0], drop_rate=[0.0, 0.0], drop_path_rate=[0.0, 0.0],
                qkv_bias=[True, True], cls_token=[False, True], qkv_projection_method=["dw_bn", "dw_bn"],
                kernel_qkv=[3, 3], padding_kv=[1, 1], stride_kv=[2, 2], padding_q=[1, 1], stride_q=[1, 1]),
    "pvt_v2": _cnn("PvtV2ForImageClassification", "PvtV2Config", hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1],
                   num_attention_heads=[1, 1, 2, 2]),
    "levit": _cnn("LevitForImageClassification", "LevitConfig", image_size=32, hidden_sizes=[16, 32, 48],
                  num_attention_heads=[1, 2, 3], depths=[1, 1, 1], key_dim=[8, 8, 8]),
    "mobilevit": _cnn("MobileViTForImageClassification", "MobileViTConfig", image_size=32, hidden_sizes=[16, 24, 32],
                      neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 48], num_attention_heads=2),
    "convnext": _cnn("ConvNextForImageClassification", "ConvNextConfig", hidden_sizes=[8, 16, 32, 64],
                     depths=[1, 1, 1, 1]),
    "poolformer": _cnn("PoolFormerForImageClassification", "PoolFormerConfig", hidden_sizes=[8, 16, 32, 64],
                       depths=[1, 1, 1, 1]),
    "bit": _cnn("BitForImageClassification", "BitConfig", num_groups=4, embedding_size=16,
                hidden_sizes=[16, 32, 64, 64], depths=[1, 1, 1, 1]),
    # torch.nn built-ins
    "nn_transformer_encoder": _torch(_TorchEncoder, x=_seq),
    "nn_transformer": _torch(_TorchTransformer, src=_seq, tgt=_seq),
    "nn_multihead_attention": _torch(_Mha, x=_seq),
    "nn_lstm": _torch(lambda: _Rnn(nn.LSTM), x=_seq),
    "nn_gru": _torch(lambda: _Rnn(nn.GRU), x=_seq),
    "embedding_bag_recommender": _torch(
        _Recommender, users=_bags, items=_bags, offsets=lambda g: torch.arange(0, 32, 4)
    ),
    # hand-written programs (breadth14; bench/breadth_programs.py): UNet blocks, a detection head,
    # an LSTM LM, a top-k MoE, checkpointing, dataclass outputs, a GRU attention decoder, a GNN, a
    # VAE, a config-driven block
    **PROGRAMS,
}  # fmt: skip


def _hf(
    cls_name: str, cfg_name: str, inputs: Callable[[], dict[str, Any]], kind: str, **cfg: Any
) -> Callable[[], Built]:
    """Any transformers model from its config, with the inputs `inputs()` builds (seeded)."""

    def build() -> Built:
        import transformers

        torch.manual_seed(0)
        config = getattr(transformers, cfg_name)(**cfg)
        model = getattr(transformers, cls_name)(config).eval()
        return model, inputs(), kind

    return build


def _gen(seed: int = 2) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _series(channels: int, length: int) -> Callable[[], dict[str, Any]]:
    return lambda: {"past_values": torch.randn(BATCH, length, channels, generator=_gen())}


def _forecast() -> dict[str, Any]:
    """Informer/Autoformer's inputs: a context of 8 steps after the largest lag (2), one time feature,
    and the 4 steps to forecast (their values teacher-forced into the decoder)."""
    g = _gen()
    return {
        "past_values": torch.randn(BATCH, 10, generator=g),
        "past_time_features": torch.randn(BATCH, 10, 1, generator=g),
        "past_observed_mask": torch.ones(BATCH, 10),
        "future_values": torch.randn(BATCH, 4, generator=g),
        "future_time_features": torch.randn(BATCH, 4, 1, generator=g),
    }


_MOE = {**_LLAMAISH, "num_local_experts": 4, "num_experts_per_tok": 2}
_FORECASTER = {"prediction_length": 4, "context_length": 8, "lags_sequence": [1, 2], "num_time_features": 1,
               "d_model": 16, "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 2,
               "decoder_attention_heads": 2, "encoder_ffn_dim": 16, "decoder_ffn_dim": 16, "dropout": 0.0,
               "attention_dropout": 0.0, "activation_dropout": 0.0, "encoder_layerdrop": 0.0,
               "decoder_layerdrop": 0.0}  # fmt: skip


def _text_ids(seq: int = SEQ, vocab: int = VOCAB) -> Callable[[], dict[str, Any]]:
    return lambda: {"input_ids": _ids(vocab, seq)}


def _s2s_ids() -> dict[str, Any]:
    return {"input_ids": _ids(), "decoder_input_ids": _ids(seq=5)}


def _s2s_masked() -> dict[str, Any]:
    return {**_s2s_ids(), "attention_mask": torch.ones(BATCH, SEQ, dtype=torch.long)}


def _wave(length: int = 400) -> Callable[[], dict[str, Any]]:
    return lambda: {"input_values": torch.randn(BATCH, length, generator=_gen())}


def _pixels(size: int = 32) -> Callable[[], dict[str, Any]]:
    return lambda: {"pixel_values": _image(size)}


_WAV = {"hidden_size": H, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "intermediate_size": FFN,
        "conv_dim": (16, 16), "conv_stride": (5, 2), "conv_kernel": (10, 3), "num_conv_pos_embeddings": 16,
        "num_conv_pos_embedding_groups": 4, "vocab_size": VOCAB, "hidden_dropout": 0.0, "attention_dropout": 0.0,
        "activation_dropout": 0.0, "feat_proj_dropout": 0.0, "layerdrop": 0.0, "mask_time_prob": 0.0}  # fmt: skip

# Added in the twenty-fourth session (breadth24): architectures whose code differs from the suite's —
# mixtures of experts of other routings, state-space and recurrent hybrids, FFT and hashing and
# landmark attention, block-sparse attention, character-level downsampling, patch time series,
# codecs with vector quantizers. Not CI rows (tests/e2e/test_breadth.py runs `MODELS`): run them
# with `breadth_compile.py --suite wider` or `--only NAME`.
WIDER: dict[str, Callable[[], Built]] = {
    # mixtures of experts
    "olmoe": _hf("OlmoeForCausalLM", "OlmoeConfig", _text_ids(), "decoder", num_experts=4, num_experts_per_tok=2,
                 pad_token_id=1, eos_token_id=2, **_LLAMAISH),
    "granitemoe": _hf("GraniteMoeForCausalLM", "GraniteMoeConfig", _text_ids(), "decoder", **_MOE),
    "phimoe": _hf("PhimoeForCausalLM", "PhimoeConfig", _text_ids(), "decoder", **_MOE),
    "jetmoe": _hf("JetMoeForCausalLM", "JetMoeConfig", _text_ids(), "decoder", hidden_size=H,
                  num_hidden_layers=LAYERS, num_key_value_heads=2, kv_channels=8, intermediate_size=FFN,
                  vocab_size=VOCAB, max_position_embeddings=64, num_local_experts=4, num_experts_per_tok=2),
    # state-space, recurrent, and their hybrids with attention
    "bamba": _hf("BambaForCausalLM", "BambaConfig", _text_ids(), "decoder", attn_layer_indices=[1],
                 mamba_n_heads=8, mamba_d_head=8, mamba_n_groups=1, mamba_d_state=8, mamba_chunk_size=4,
                 mamba_expand=2, **_LLAMAISH),
    "zamba2": _hf("Zamba2ForCausalLM", "Zamba2Config", _text_ids(), "decoder", hidden_size=H, num_hidden_layers=2,
                  layers_block_type=["mamba", "hybrid"], mamba_d_state=8, n_mamba_heads=4, mamba_headdim=16,
                  chunk_size=4, intermediate_size=FFN, num_attention_heads=HEADS, num_key_value_heads=HEADS,
                  vocab_size=VOCAB, max_position_embeddings=64, use_mamba_kernels=False, adapter_rank=4,
                  use_shared_attention_adapter=True),
    "falcon_h1": _hf("FalconH1ForCausalLM", "FalconH1Config", _text_ids(), "decoder", mamba_d_ssm=32,
                     mamba_n_heads=4, mamba_d_head=8, mamba_d_state=8, mamba_chunk_size=4, **_LLAMAISH),
    "recurrent_gemma": _hf("RecurrentGemmaForCausalLM", "RecurrentGemmaConfig", _text_ids(), "decoder",
                           hidden_size=H, num_hidden_layers=3, num_attention_heads=HEADS, num_key_value_heads=1,
                           intermediate_size=FFN, vocab_size=VOCAB, lru_width=H, attention_window_size=4,
                           conv1d_width=4, block_types=["recurrent", "recurrent", "attention"]),
    "rwkv": _hf("RwkvForCausalLM", "RwkvConfig", _text_ids(), "decoder", vocab_size=VOCAB, context_length=64,
                hidden_size=H, num_hidden_layers=LAYERS, attention_hidden_size=H, intermediate_size=FFN),
    # encoders with unusual attention or embeddings
    "esm": _hf("EsmForMaskedLM", "EsmConfig", _text_ids(), "encoder", position_embedding_type="rotary",
               pad_token_id=1, mask_token_id=2, **_BERTISH),
    "big_bird": _hf("BigBirdForMaskedLM", "BigBirdConfig", _text_ids(seq=32), "encoder",
                    attention_type="block_sparse", block_size=2, num_random_blocks=1, **_BERTISH),
    "canine": _hf("CanineModel", "CanineConfig", _text_ids(seq=16, vocab=1000), "encoder", hidden_size=H,
                  num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=FFN, downsampling_rate=4,
                  num_hash_functions=4, num_hash_buckets=64, local_transformer_stride=4, max_position_embeddings=64,
                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
    "fnet": _hf("FNetForMaskedLM", "FNetConfig", _text_ids(), "encoder", hidden_size=H, num_hidden_layers=LAYERS,
                intermediate_size=FFN, vocab_size=VOCAB, max_position_embeddings=64, hidden_dropout_prob=0.0),
    # fails under any compiler (torch.compile alike): while compiling, transformers' bidirectional
    # mask is a (batch, 1, seq, seq) tensor, which the landmark attention's (batch, heads,
    # landmarks, seq) scores cannot take; eager passes None
    "nystromformer": _hf("NystromformerForMaskedLM", "NystromformerConfig", _text_ids(seq=16), "encoder",
                         num_landmarks=4, segment_means_seq_len=16, conv_kernel_size=3, **_BERTISH),
    "yoso": _hf("YosoForMaskedLM", "YosoConfig", _text_ids(), "encoder", use_expectation=True, num_hash=4,
                hash_code_len=4, conv_window=3, **_BERTISH),
    "rembert": _hf("RemBertForMaskedLM", "RemBertConfig", _text_ids(), "encoder", input_embedding_size=16,
                   output_embedding_size=16, pad_token_id=0, bos_token_id=1, eos_token_id=2, **_BERTISH),
    "nomic_bert": _hf("NomicBertModel", "NomicBertConfig", _text_ids(), "encoder", head_dim=8, **_BERTISH),
    # vision
    "pvt": _hf("PvtForImageClassification", "PvtConfig", _pixels(32), "vision", image_size=32,
               hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1], num_attention_heads=[1, 1, 2, 2],
               sequence_reduction_ratios=[4, 2, 1, 1], mlp_ratios=[2, 2, 2, 2], num_labels=10),
    "swiftformer": _hf("SwiftFormerForImageClassification", "SwiftFormerConfig", _pixels(32), "vision",
                       image_size=32, depths=[1, 1, 1, 1], embed_dims=[8, 16, 32, 64], num_labels=10),
    "vitdet": _hf("VitDetModel", "VitDetConfig", _pixels(32), "vision", image_size=32, pretrain_image_size=32,
                  patch_size=4, hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=HEADS, mlp_ratio=2,
                  window_block_indices=[0], window_size=4, use_relative_position_embeddings=True),
    "glpn": _hf("GLPNForDepthEstimation", "GLPNConfig", _pixels(32), "vision", hidden_sizes=[8, 16, 32, 64],
                depths=[1, 1, 1, 1], num_attention_heads=[1, 1, 2, 2], decoder_hidden_size=16),
    "dinov2_with_registers": _hf("Dinov2WithRegistersForImageClassification", "Dinov2WithRegistersConfig",
                                 _pixels(32), "vision", num_register_tokens=2, **{**_VIT, "mlp_ratio": 2}),
    # 64 pixels: at 32 the last stage is 1x1, and its batch norms in train mode normalize 2 values
    # each (variances near 1e-7, under eps): eager's own float32 gradients are 0.1 off float64's there
    "textnet": _hf("TextNetForImageClassification", "TextNetConfig", _pixels(64), "vision", stem_out_channels=8,
                   hidden_sizes=[8, 8, 16, 16, 32], num_labels=10),
    "hgnet_v2": _hf("HGNetV2ForImageClassification", "HGNetV2Config", _pixels(32), "vision",
                    stem_channels=[3, 8, 8], stage_in_channels=[8, 16, 32, 32], stage_mid_channels=[8, 8, 16, 16],
                    stage_out_channels=[16, 32, 32, 64], hidden_sizes=[16, 32, 32, 64], depths=[1, 1, 1, 1],
                    stage_numb_of_layers=[2, 2, 2, 2], num_labels=10),
    # audio
    "sew": _hf("SEWForCTC", "SEWConfig", _wave(), "audio", squeeze_factor=2, **_WAV),
    "unispeech": _hf("UniSpeechForCTC", "UniSpeechConfig", _wave(), "audio", **_WAV),
    "wav2vec2_conformer": _hf("Wav2Vec2ConformerForCTC", "Wav2Vec2ConformerConfig", _wave(), "audio",
                              position_embeddings_type="rotary", conv_depthwise_kernel_size=3, **_WAV),
    "encodec": _hf("EncodecModel", "EncodecConfig", lambda: {"input_values": torch.randn(BATCH, 1, 320,
                   generator=_gen())}, "audio", hidden_size=16, num_filters=4, upsampling_ratios=[4, 2],
                   codebook_size=32, codebook_dim=16, target_bandwidths=[1.5], sampling_rate=800),
    # encoder-decoders
    # the attention mask given: without one, LongT5's stack makes an all-ones mask only when not
    # compiling (`is_torchdynamo_compiling()`), and its transient-global attention then
    # concatenates a batch-1 local bias with a batch-2 side bias (torch.compile fails alike)
    "longt5": _hf("LongT5ForConditionalGeneration", "LongT5Config", _s2s_masked, "seq2seq", d_model=H, d_ff=FFN,
                  d_kv=8, num_layers=LAYERS, num_heads=HEADS, vocab_size=VOCAB, dropout_rate=0.0,
                  encoder_attention_type="transient-global", local_radius=2, global_block_size=4),
    "umt5": _hf("UMT5ForConditionalGeneration", "UMT5Config", _s2s_ids, "seq2seq", d_model=H, d_ff=FFN, d_kv=8,
                num_layers=LAYERS, num_heads=HEADS, vocab_size=VOCAB, dropout_rate=0.0),
    "prophetnet": _hf("ProphetNetForConditionalGeneration", "ProphetNetConfig", _s2s_ids, "seq2seq",
                      hidden_size=H, encoder_ffn_dim=FFN, decoder_ffn_dim=FFN, num_encoder_layers=LAYERS,
                      num_decoder_layers=LAYERS, num_encoder_attention_heads=HEADS,
                      num_decoder_attention_heads=HEADS, vocab_size=VOCAB, ngram=2, num_buckets=8,
                      relative_max_distance=16, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                      max_position_embeddings=64),
    "fsmt": _hf("FSMTForConditionalGeneration", "FSMTConfig", _s2s_ids, "seq2seq", langs=["en", "de"],
                src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, d_model=H, encoder_layers=LAYERS,
                decoder_layers=LAYERS, encoder_attention_heads=HEADS, decoder_attention_heads=HEADS,
                encoder_ffn_dim=FFN, decoder_ffn_dim=FFN, max_position_embeddings=64, dropout=0.0,
                attention_dropout=0.0, activation_dropout=0.0),
    "speech_to_text": _hf("Speech2TextForConditionalGeneration", "Speech2TextConfig",
                          lambda: {"input_features": torch.randn(BATCH, 32, 16, generator=_gen()),
                                   "decoder_input_ids": _ids(seq=5)}, "seq2seq", d_model=H, encoder_layers=LAYERS,
                          decoder_layers=LAYERS, encoder_attention_heads=HEADS, decoder_attention_heads=HEADS,
                          encoder_ffn_dim=FFN, decoder_ffn_dim=FFN, vocab_size=VOCAB, input_feat_per_channel=16,
                          input_channels=1, conv_channels=16, num_conv_layers=2, max_source_positions=64,
                          max_target_positions=64, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0),
    # time series
    "patchtst": _hf("PatchTSTForPrediction", "PatchTSTConfig", _series(3, 32), "encoder", num_input_channels=3,
                    context_length=32, patch_length=8, patch_stride=8, prediction_length=8, d_model=H,
                    num_attention_heads=HEADS, num_hidden_layers=LAYERS, ffn_dim=FFN, dropout=0.0,
                    attention_dropout=0.0, ff_dropout=0.0, head_dropout=0.0, path_dropout=0.0),
    "patchtsmixer": _hf("PatchTSMixerForPrediction", "PatchTSMixerConfig", _series(3, 32), "encoder",
                        num_input_channels=3, context_length=32, patch_length=8, patch_stride=8,
                        prediction_length=8, d_model=16, num_layers=LAYERS, dropout=0.0, head_dropout=0.0,
                        self_attn=True, self_attn_heads=2),
    "informer": _hf("InformerForPrediction", "InformerConfig", _forecast, "encoder", **_FORECASTER),
    "autoformer": _hf("AutoformerForPrediction", "AutoformerConfig", _forecast, "encoder", label_length=4,
                       moving_average=3, **_FORECASTER),
}  # fmt: skip


def first_tensor(out: Any) -> torch.Tensor:
    """The main output of a model (logits, last hidden state, the tensor a torch module returns)."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict):
        for v in out.values():
            if isinstance(v, torch.Tensor):
                return v
    if isinstance(out, (tuple, list)):
        return first_tensor(out[0])
    if dataclasses.is_dataclass(out) and not isinstance(out, type):  # a ModelOutput is a dict, above
        return first_tensor([v for f in dataclasses.fields(out) if (v := getattr(out, f.name)) is not None])
    raise TypeError(f"no tensor in {type(out).__name__}")
