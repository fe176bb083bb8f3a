"""The fused runtime's fault-test pipeline (`tests.e2e.fused_target:topology`): two branches in
one streaming query, fed by topics of their own so a test drives each alone.

- windows (`tests/e2e/holds_target.py`, hold on): source `events` (FUSED_TARGET_WINDOWS_TOPIC)
  -> `windower` (1-second window counts, produced by low-watermark timers) -> `collector`;
- chain (`tests/e2e/chain_target.py`): source `input` (FUSED_TARGET_CHAIN_TOPIC) -> `count` ->
  `relay` -> `chain_collector`. Its input has no id header: each record's id is its Kafka
  position, so `count` deduplicates by offset marks (`state/offset_marks.py`), not the catalog.

Each computation reads one branch's streams only, so its watermarks and hand-overs never wait
for the other branch. Configured by the environment: those two topics and MILLSTREAM_APP.
"""

from __future__ import annotations

import os

from millstream import Topology
from tests.e2e.chain_target import add_chain
from tests.e2e.holds_target import build

CHAIN_COLLECTOR = "chain_collector"


def topology() -> Topology:
    windows = build(
        os.environ["MILLSTREAM_APP"], os.environ["FUSED_TARGET_WINDOWS_TOPIC"], hold=True
    )
    return add_chain(
        windows, os.environ["FUSED_TARGET_CHAIN_TOPIC"], CHAIN_COLLECTOR, id_header=None
    )
