"""The package installs and imports on its own, with the version its metadata declares."""

import importlib.metadata

import kiln_codegen_cpp


def test_version_matches_distribution_metadata() -> None:
    assert kiln_codegen_cpp.__version__ == importlib.metadata.version("kiln-codegen-cpp")
