"""kiln-symbolic: symbolic sizes shared by capture, tracing and lowering.

`ShapeEnv` (shape_env.py) owns the symbols of one capture: their hints, value ranges, the
replacements learned from guards, and the guards themselves, rendered as Python by
`produce_guards`. `SymNode` (symnode.py) is the node behind every `torch.SymInt` kiln makes, so
meta kernels and decompositions run on fake tensors with symbolic sizes. Expressions are sympy;
`FloorDiv` (functions.py) is Python's `//`; `pexpr` (printer.py) prints an expression as Python.
"""

from kiln_symbolic.fold import UnfoldableExpr, fold_expr
from kiln_symbolic.functions import (
    FLOAT_OF_CALL,
    INT_OF_FLOAT_CALL,
    CeilOfFloat,
    FloatAdd,
    FloatMul,
    FloatNeg,
    FloatOp,
    FloatPow,
    FloatSqrt,
    FloatSub,
    FloatTrueDiv,
    FloorDiv,
    FloorOfFloat,
    IntOfFloat,
    IntTrueDiv,
    ToFloat,
    TruncOfFloat,
)
from kiln_symbolic.printer import PythonPrinter, pexpr
from kiln_symbolic.ranges import ValueRange, bound, decide
from kiln_symbolic.shape_env import (
    UNBACKED_HINT,
    ConstraintViolation,
    DimDynamic,
    GuardOnDataDependent,
    RenderedGuard,
    ShapeEnv,
    ShapeGuard,
)
from kiln_symbolic.symnode import (
    SymbolicUnsupported,
    SymNode,
    expr_of,
    hint_of,
    is_symbolic,
    make_symfloat,
    make_symint,
    symbol_of,
    wrap,
)

__version__ = "0.1.0"

__all__ = [
    "FLOAT_OF_CALL",
    "INT_OF_FLOAT_CALL",
    "UNBACKED_HINT",
    "CeilOfFloat",
    "ConstraintViolation",
    "DimDynamic",
    "FloatAdd",
    "FloatMul",
    "FloatNeg",
    "FloatOp",
    "FloatPow",
    "FloatSqrt",
    "FloatSub",
    "FloatTrueDiv",
    "FloorDiv",
    "FloorOfFloat",
    "GuardOnDataDependent",
    "IntOfFloat",
    "IntTrueDiv",
    "PythonPrinter",
    "RenderedGuard",
    "ShapeEnv",
    "ShapeGuard",
    "SymNode",
    "SymbolicUnsupported",
    "ToFloat",
    "TruncOfFloat",
    "UnfoldableExpr",
    "ValueRange",
    "bound",
    "decide",
    "expr_of",
    "fold_expr",
    "hint_of",
    "is_symbolic",
    "make_symfloat",
    "make_symint",
    "pexpr",
    "symbol_of",
    "wrap",
]
