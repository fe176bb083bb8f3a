"""`state/wire.py`: checkpointed productions as bytes, and checkpoints an older version wrote."""

from __future__ import annotations

from millstream.records import Production
from millstream.state import _codec
from millstream.state.wire import decode_production, encode_production

PRODUCTION = Production(
    "counts", "key-é", b"\x00value", -1_700_000_000_000, b"\xffid", 1_700_000_000_123, 42,
    (("trace", b"t1"), ("tenant", b"")),
)  # fmt: skip


def _legacy(p: Production) -> bytes:
    """A checkpoint as versions before 2026-12-07 wrote it: a length-prefixed list of fields,
    integers as 8 signed big-endian bytes, headers a flat list of names and values."""

    def number(value: int) -> bytes:
        return value.to_bytes(8, "big", signed=True)

    headers = _codec.pack([part for k, v in p.headers for part in (k.encode(), v)])
    fields = [p.stream.encode(), p.key.encode(), p.value, number(p.timestamp), p.id]
    return _codec.pack([*fields, number(p.system_time), number(p.seq), headers])


def test_a_checkpoint_decodes_to_the_production_it_was_made_from() -> None:
    blob = encode_production(PRODUCTION)
    assert decode_production(blob) == PRODUCTION
    bare = Production("s", "", b"", 0, b"", 0)
    assert decode_production(encode_production(bare)) == bare


def test_a_checkpoint_written_by_an_older_version_still_decodes() -> None:
    """Checkpoints pending across an upgrade are delivered by the new version, bit for bit."""
    old = _legacy(PRODUCTION)
    assert old[:1] == b"\x00" and encode_production(PRODUCTION)[:1] == b"\x98"
    assert decode_production(old) == PRODUCTION
