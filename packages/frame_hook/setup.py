"""Builds the C extension; everything else is in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "kiln_frame_hook._C",
            sources=[
                "src/kiln_frame_hook/_C.c",
                "src/kiln_frame_hook/guard_tree.c",
                "src/kiln_frame_hook/guard_memo.c",
            ],
            depends=["src/kiln_frame_hook/guard_tree.h", "src/kiln_frame_hook/guard_tree_internal.h"],
            extra_compile_args=["-O2", "-Wall", "-Wno-missing-field-initializers"],
        )
    ]
)
