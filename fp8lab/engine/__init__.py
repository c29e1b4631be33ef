"""The engine wing: everything that starts, drives and records a vLLM engine, and nothing of any study.

- :mod:`fp8lab.engine.run`: running one engine (:func:`~fp8lab.engine.run.run_engine`), its result
  (:class:`~fp8lab.engine.run.EngineResult`) and failure classes, the checks made before an engine starts.
- :mod:`fp8lab.engine.worker`: the process an engine runs in (its environment, the drivers).
- :mod:`fp8lab.engine.results`: the results store and the run key.
- :mod:`fp8lab.engine.capability`: what this machine can run (the FP8 KV kernel, emulation).
- :mod:`fp8lab.engine.devices`: what the machine is (GPU, CPU layout, provenance).
- :mod:`fp8lab.engine.bandwidth`: the device's measured copy bandwidth.
- :mod:`fp8lab.engine.fp8emu`: the FP8 KV emulation plugin vLLM loads in every process it starts.

Nothing is imported here: a worker process imports only the modules it needs.
"""
