"""Tiny transformers decoders (random weights, built from configs) that the end-to-end capture
tests share."""

from __future__ import annotations

from typing import Any

import transformers


def gpt2() -> Any:
    cfg = transformers.GPT2Config(
        n_embd=32, n_layer=2, n_head=4, vocab_size=64, n_positions=64, use_cache=False
    )
    return transformers.GPT2LMHeadModel(cfg)


def llama() -> Any:
    cfg = transformers.LlamaConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        vocab_size=64,
        use_cache=False,
    )
    return transformers.LlamaForCausalLM(cfg)
