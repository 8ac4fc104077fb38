"""kiln-aotgrad: not built yet.

It will own: ahead-of-time autograd: tracing torch-level FX graphs to aten, decompositions,
functionalization, joint forward+backward graphs and min-cut partitioning.
"""

__version__ = "0.1.0"
