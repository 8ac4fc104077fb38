"""kiln: not built yet.

It will own: the umbrella: kiln.compile, kiln.explain, kiln.reset, and the default backend that
wires dynamo, aotgrad, loopir and the code generators.
"""

__version__ = "0.1.0"
