"""The umbrella installs and imports on its own, with the version its metadata declares."""

import importlib.metadata

import kiln


def test_version_matches_distribution_metadata() -> None:
    assert kiln.__version__ == importlib.metadata.version("kiln")
