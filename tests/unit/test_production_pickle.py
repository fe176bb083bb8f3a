"""A production crosses from a shard task to the driver pickled: every field must survive."""

from __future__ import annotations

import dataclasses
import pickle

from millstream.records import Production


def test_a_production_pickles_every_field_in_order() -> None:
    production = Production(
        stream="out", key="k", value=b"v", timestamp=7, id=b"\x01" * 16, system_time=9, seq=3,
        headers=(("h", b"1"),),
    )  # fmt: skip
    for protocol in (2, pickle.HIGHEST_PROTOCOL):
        assert pickle.loads(pickle.dumps(production, protocol=protocol)) == production
    # A field added to the class without adding it to __reduce__ would be dropped silently.
    _, arguments = production.__reduce__()
    names = [f.name for f in dataclasses.fields(Production)]
    assert list(arguments) == [getattr(production, name) for name in names]
