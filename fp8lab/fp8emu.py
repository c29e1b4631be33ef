"""The FP8 emulation plugin's old entry point (``fp8lab.fp8emu:register``): an install of fp8lab made before the
plugin moved to :mod:`fp8lab.engine.fp8emu` still names it in its metadata; ``pip install -e .`` registers the new
one (pyproject.toml), after which this module is unused."""

from fp8lab.engine.fp8emu import register

__all__ = ["register"]
