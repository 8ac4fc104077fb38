"""The lowering families, registered into ``kiln_loopir.lowering.LOWERINGS`` when imported.

``pointwise`` (math, comparisons, activations, casts), ``views`` (index remapping), ``reductions``
(sum/mean/amax/argmax/var/..., softmax, layer norm), ``memory`` (cat, padding, indexing, gather,
scatter, embedding), ``pooling`` (max_pool2d with indices), ``linalg`` (addmm as mm + a fusible bias) and ``creation``
(full/zeros/ones/arange/iota). ``lowering.find_lowering``
imports them on first use.
"""
