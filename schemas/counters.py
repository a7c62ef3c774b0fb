"""One base for the plain counter sets (decoder, ingest, subscriptions): ints a metrics
collector reads by name, added up across copies."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass
class CounterSet:
    """Subclass as a ``@dataclass`` whose fields are all ints starting at 0."""

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def add(self, other: CounterSet) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
