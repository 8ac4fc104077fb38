"""HuggingFace models (the public suite's architectures, tiny configs): never a wrong answer.

Their forwards use try/except helpers, ModelOutput (an OrderedDict subclass) and registries:
the frames split at graph breaks (kiln_dynamo's continuations), the parts that cannot be split
run as plain Python with recorded reasons, and the inner frames are captured on their own; the
result must equal eager either way.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers

import kiln_dynamo


def _gpt2() -> Any:
    cfg = transformers.GPT2Config(
        n_embd=32, n_layer=2, n_head=4, vocab_size=64, n_positions=32, use_cache=False
    )
    return transformers.GPT2LMHeadModel(cfg)


def _llama() -> Any:
    cfg = transformers.LlamaConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        vocab_size=64,
        use_cache=False,
    )
    return transformers.LlamaForCausalLM(cfg)


@pytest.mark.parametrize("make", [_gpt2, _llama], ids=["gpt2", "llama"])
def test_hf_model_matches_eager(make: Any) -> None:
    torch.manual_seed(0)
    model = make().eval()
    ids = torch.randint(0, 64, (2, 8))
    compiled = kiln_dynamo.compile(model)
    with torch.no_grad():
        ref = model(ids).logits
        for _ in range(2):
            torch.testing.assert_close(compiled(ids).logits, ref)
    assert kiln_dynamo.counters.graphs >= 1
    assert all(reason for _, reason in kiln_dynamo.counters.fallbacks)
