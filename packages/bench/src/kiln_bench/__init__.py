"""kiln-bench: measures eager, kiln and torch.compile (inductor) in one run.

Suites: `models` (the public model suite of MODELS.md, built from configs with seeded weights:
gpt2, bert, distilbert, llama, t5, vit, resnet, convnext, mlp, cnn; inference and training) and
`micro` (pointwise, softmax, layer norm, row/column reductions; achieved GB/s). Per model: accuracy
against eager (PyTorch's harness rule, see `accuracy`), compile time from empty caches, and the
speedup of medians over interleaved eager/compiled calls; geomean per backend; reports as a table,
JSON and a PNG. `--profile` adds the profile view (`profile`): per model and backend, wall ms,
device kernel ms and kernels per call, the device's idle share and the five slowest kernels, from
torch.profiler (CPU ops' self time on the CPU). Run `python -m kiln_bench --help`.

This module imports nothing heavy: `python -m kiln_bench` must set environment variables before
torch is imported.
"""

__version__ = "0.1.0"
