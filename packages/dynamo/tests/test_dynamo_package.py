"""The package installs and imports on its own, with the version its metadata declares."""

import importlib.metadata

import kiln_dynamo


def test_version_matches_distribution_metadata() -> None:
    assert kiln_dynamo.__version__ == importlib.metadata.version("kiln-dynamo")


def test_generated_fx_source_is_forgotten_when_the_module_is_freed() -> None:
    """Note [Generated FX source outlives its module]: torch.fx keeps a module's generated source in
    linecache after the module is gone; kiln's graphs drop it with their forward."""
    import gc
    import linecache

    import torch

    from kiln_dynamo import forget_source_when_freed

    def build() -> tuple[torch.fx.GraphModule, str]:
        gm = torch.fx.symbolic_trace(lambda x: x.sin() + 1)
        forget_source_when_freed(gm)
        return gm, type(gm).forward.__code__.co_filename

    gm, key = build()
    kept, _ = build()
    kept_key = type(kept).forward.__code__.co_filename
    assert torch.fx.graph_module._loader.get_source(key)  # readable while the module lives
    del gm
    gc.collect()
    assert key not in linecache.cache
    assert torch.fx.graph_module._loader.get_source(key) is None
    assert torch.fx.graph_module._loader.get_source(kept_key)
    torch.testing.assert_close(kept(torch.ones(2)), torch.ones(2).sin() + 1)
