"""The package installs and imports on its own, with the version its metadata declares."""

import importlib.metadata

import kiln_aotgrad


def test_version_matches_distribution_metadata() -> None:
    assert kiln_aotgrad.__version__ == importlib.metadata.version("kiln-aotgrad")
