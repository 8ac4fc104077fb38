"""The package installs and imports on its own, with the version its metadata declares."""

import importlib.metadata

import kiln_loopir


def test_version_matches_distribution_metadata() -> None:
    assert kiln_loopir.__version__ == importlib.metadata.version("kiln-loopir")
