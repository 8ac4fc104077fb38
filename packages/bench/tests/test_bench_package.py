"""The package installs and imports on its own, with the version its metadata declares."""

import importlib.metadata

import kiln_bench


def test_version_matches_distribution_metadata() -> None:
    assert kiln_bench.__version__ == importlib.metadata.version("kiln-bench")
