"""HuggingFace models (the public suite's architectures, tiny configs): never a wrong answer.

Their forwards use try/except helpers, ModelOutput (an OrderedDict subclass) and registries:
ModelOutputs are traced (one graph for gpt2, llama and t5); what still breaks splits the frame
(kiln_dynamo's continuations), the parts that cannot be split run as plain Python with recorded
reasons, and the inner frames are captured on their own; the result must equal eager either way.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import tiny_hf
import torch
import transformers

import kiln_dynamo

_gpt2, _llama = tiny_hf.gpt2, tiny_hf.llama


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


def _t5() -> Any:
    cfg = transformers.T5Config(
        d_model=32,
        d_ff=64,
        d_kv=8,
        num_layers=2,
        num_heads=4,
        vocab_size=64,
        dropout_rate=0.0,
        use_cache=False,
    )
    return transformers.T5ForConditionalGeneration(cfg)


def _bert() -> Any:
    cfg = transformers.BertConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        vocab_size=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return transformers.BertForMaskedLM(cfg)


def _distilbert() -> Any:
    cfg = transformers.DistilBertConfig(
        dim=32, n_layers=2, n_heads=4, hidden_dim=64, vocab_size=64, dropout=0.0, attention_dropout=0.0
    )
    return transformers.DistilBertForMaskedLM(cfg)


def _inputs(make: Any) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 64, (2, 8), generator=g)
    if make is _t5:
        return {"input_ids": ids, "decoder_input_ids": torch.randint(0, 64, (2, 5), generator=g)}
    return {"input_ids": ids}


def _same_output(a: Any, b: Any) -> None:
    assert type(a) is type(b) and list(a.keys()) == list(b.keys())
    for k in a:
        torch.testing.assert_close(a[k], b[k]) if isinstance(a[k], torch.Tensor) else None


@pytest.mark.parametrize(
    "make", [_gpt2, _llama, _t5, _bert, _distilbert], ids=["gpt2", "llama", "t5", "bert", "distilbert"]
)
def test_hf_model_outputs_are_traced_in_one_graph(make: Any) -> None:
    """ModelOutputs built by the layers and read by the callers (T5 reads `encoder_outputs[0]`)
    stay in the graph: one graph, no break, and the caller gets a real ModelOutput back. BERT's
    `apply_chunking_to_forward` checks its callback with `inspect.signature`, folded while tracing."""
    torch.manual_seed(0)
    model = make().eval()
    inputs = _inputs(make)
    with torch.no_grad():
        report = kiln_dynamo.explain(model)(**inputs)
        ref = model(**inputs)
    assert (report.graph_count, report.graph_break_count) == (1, 0), str(report)
    _same_output(report.result, ref)


@pytest.mark.parametrize("make", [_t5, _bert], ids=["t5", "bert"])
def test_hf_model_training_grads_match_eager(make: Any) -> None:
    torch.manual_seed(0)
    model = make().train()
    compiled_model = copy.deepcopy(model)
    inputs = _inputs(make)
    labels = inputs.get("decoder_input_ids", inputs["input_ids"])
    compiled = kiln_dynamo.compile(compiled_model)
    ref = model(**inputs, labels=labels)
    ref.loss.backward()
    got = compiled(**inputs, labels=labels)
    got.loss.backward()
    _same_output(got, ref)
    for (name, p), q in zip(model.named_parameters(), compiled_model.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, msg=name)


@pytest.mark.parametrize("make", [_t5, _bert], ids=["t5", "bert"])
def test_hf_model_loss_in_forward_is_one_graph(make: Any) -> None:
    """The heads build `CrossEntropyLoss()` inside forward when given labels: traced, not a break."""
    torch.manual_seed(0)
    model = make().train()
    inputs = _inputs(make)
    labels = inputs.get("decoder_input_ids", inputs["input_ids"])
    report = kiln_dynamo.explain(model)(**inputs, labels=labels)
    assert (report.graph_count, report.graph_break_count) == (1, 0), str(report)
    torch.testing.assert_close(report.result.loss, model(**inputs, labels=labels).loss)
