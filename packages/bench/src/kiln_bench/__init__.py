"""kiln-bench: measures eager, kiln and torch.compile (inductor) in one run.

Suites: `models` (the public model suite of MODELS.md, built from configs with seeded weights:
gpt2, bert, distilbert, llama, t5, vit, resnet, convnext, mlp, cnn; inference and training) and
`micro` (pointwise, softmax, layer norm, row/column reductions; achieved GB/s). Per model: accuracy
against eager (PyTorch's harness rule, see `accuracy`), compile time from empty caches, and the
speedup of medians over interleaved eager/compiled calls; geomean per backend; reports as a table,
JSON and a PNG. Run `python -m kiln_bench --help`.

This module imports nothing heavy: `python -m kiln_bench` must set environment variables before
torch is imported.
"""

__version__ = "0.1.0"
