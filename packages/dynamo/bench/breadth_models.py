"""The breadth suite: real architectures at tiny size, built from configs (random weights, no download).

`MODELS` maps a name to a builder that returns `(model, inputs, kind)`: `model` in eval mode,
`inputs` a dict of keyword arguments, `kind` one of "decoder" (a causal LM: also run with
`use_cache=True`), "encoder", "seq2seq", "vision", "audio", "torch". Every builder seeds torch,
so the same name always gives the same weights and inputs. Used by `breaks.py --models` (the
table of graphs / breaks / frames in Python per model, against torch.compile) and by the CI test
`tests/e2e/test_breadth.py` over a fast subset.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
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


def _whisper_encoder() -> Built:
    import transformers

    torch.manual_seed(0)
    cfg = transformers.WhisperConfig(
        d_model=H, encoder_layers=LAYERS, decoder_layers=LAYERS, encoder_attention_heads=HEADS,
        decoder_attention_heads=HEADS, encoder_ffn_dim=FFN, decoder_ffn_dim=FFN, vocab_size=VOCAB,
        num_mel_bins=16, max_source_positions=16, max_target_positions=16, dropout=0.0, pad_token_id=0,
        bos_token_id=1, eos_token_id=2, decoder_start_token_id=3,
    )  # fmt: skip
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
    # encoder-decoders, audio
    "bart": _bart,
    "t5": _t5,
    "pegasus": _pegasus,
    "whisper_encoder": _whisper_encoder,
    "wav2vec2": _wav2vec2,
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
    # torch.nn built-ins
    "nn_transformer_encoder": _torch(_TorchEncoder, x=_seq),
    "nn_transformer": _torch(_TorchTransformer, src=_seq, tgt=_seq),
    "nn_multihead_attention": _torch(_Mha, x=_seq),
    "nn_lstm": _torch(lambda: _Rnn(nn.LSTM), x=_seq),
    "nn_gru": _torch(lambda: _Rnn(nn.GRU), x=_seq),
    "embedding_bag_recommender": _torch(
        _Recommender, users=_bags, items=_bags, offsets=lambda g: torch.arange(0, 32, 4)
    ),
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
    raise TypeError(f"no tensor in {type(out).__name__}")
