"""fp8lab's error types. Standard library only: importing this module loads nothing else, so any layer (a
worker, the KV calculator, the CLI) can raise or catch them without importing :mod:`fp8lab.specs`, which
re-exports them (``from fp8lab.specs import SpecError`` keeps working)."""

from __future__ import annotations

from typing import Any


class SpecError(ValueError):
    """A spec field holds a value that is not allowed.

    ``str(err)`` reads ``<Spec>.<field> = <value!r>: <what is allowed>``.
    """

    def __init__(self, spec: str, field_name: str, value: Any, allowed: str):
        self.spec, self.field, self.value, self.allowed = spec, field_name, value, allowed
        super().__init__(f"{spec}.{field_name} = {value!r}: {allowed}")

    def __reduce__(self) -> tuple[Any, ...]:
        # rebuilt from its four fields (the default passes only the message, which __init__ cannot take), so an
        # error crosses a process boundary intact
        return type(self), (self.spec, self.field, self.value, self.allowed)


__all__ = ["SpecError"]
