"""Catalog reads stay rare at steady state even when two workers alternate on the same shards."""

from __future__ import annotations

from millstream.state.catalog import Verdict
from millstream.state.keys import ShardKeys
from millstream.state.shard import ShardConfig, ShardStore, SoftStateCache

T0 = 1_700_000_000_000


def test_two_alternating_workers_read_catalog_for_at_most_one_percent(
    redis_url: str, redis_namespace: str
) -> None:
    from millstream.state.client import connect

    client = connect(redis_url, cached=False)
    workers = [SoftStateCache(), SoftStateCache()]
    config = ShardConfig(bucket_ms=600_000, bloom_expected=50_000, bloom_fp_rate=0.001)
    shards = 4
    reads = checked = 0
    for batch in range(40):
        worker = workers[batch % 2]  # Spark does not pin shards to Python workers
        for shard in range(shards):
            store = ShardStore(client, ShardKeys(redis_namespace, "c", shard), config, worker)
            store.acquire()
            ids = [f"{shard}-{batch}-{i}".encode() for i in range(500)]
            verdicts = store.dedup([(i, T0 + batch, i) for i in ids], 0)
            assert all(v is Verdict.NEW for v in verdicts)
            txn = store.begin()
            txn.add_ids([(store.bucket_of(T0 + batch), i, i) for i in ids])
            store.commit(txn)
            if batch >= 2:  # steady state: after each worker's first (rebuilding) visit
                reads += store.dedup_stats.catalog_reads
                checked += store.dedup_stats.checked
    print(f"catalog reads per record: {reads / checked:.5f} over {checked} records")
    assert reads / checked <= 0.01
    client.close()
