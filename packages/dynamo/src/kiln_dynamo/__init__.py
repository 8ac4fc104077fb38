"""kiln-dynamo: not built yet.

It will own: graph capture from Python bytecode: symbolic evaluation into torch.fx graphs, fake
tensors, symbolic shapes, guards, graph breaks and resume functions, the backend protocol, explain,
counters and logging.
"""

__version__ = "0.1.0"
