"""fp8lab: should I turn on FP8 KV cache in vLLM for my model, on my GPU, and what will it cost me?

Logic lives in this package; the studies in ``notebooks/`` are thin stories over it.
Importing ``fp8lab`` never imports torch or vLLM: the calculator (``fp8lab.kvmath``) works alone.
"""

__version__ = "0.1.0"
