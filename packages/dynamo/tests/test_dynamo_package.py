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


def test_graph_modules_generate_their_source_on_first_use() -> None:
    """Note [Graph modules generated on demand]: building the module or recompiling it after a
    rewrite generates no source; calling it does, answers as a plain GraphModule, and its source is
    forgotten with it (Note [Generated FX source outlives its module])."""
    import gc
    import linecache

    import torch

    from kiln_dynamo import graph_module

    def build() -> torch.fx.GraphModule:
        return graph_module(torch.nn.Module(), torch.fx.symbolic_trace(lambda x: x.sin() + 1).graph)

    def stale(gm: torch.fx.GraphModule) -> bool:  # a helper: no assert keeps the class alive
        return bool(type(gm)._needs_recompile())

    def source_file(gm: torch.fx.GraphModule) -> str:
        return str(type(gm).forward.__code__.co_filename)

    gm = build()
    assert stale(gm)  # nothing generated yet
    (add,) = [n for n in gm.graph.nodes if n.op == "call_function" and "add" in str(n.target)]
    add.args = (add.args[0], 2)  # a pass rewrites it and asks for a recompile: still nothing
    gm.recompile()
    assert stale(gm)
    torch.testing.assert_close(gm(torch.ones(2)), torch.ones(2).sin() + 2)
    assert not stale(gm)
    key = source_file(gm)
    assert "sin" in gm.code and torch.fx.graph_module._loader.get_source(key)
    del gm, add
    gc.collect()
    assert key not in linecache.cache
    assert torch.fx.graph_module._loader.get_source(key) is None
