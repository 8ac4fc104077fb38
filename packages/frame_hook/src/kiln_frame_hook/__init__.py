"""kiln-frame-hook: the PEP 523 frame-evaluation hook (being built)."""

__version__ = "0.1.0"
