"""Cluster ids for the embedded broker must survive a command line."""

from __future__ import annotations

import base64

from millstream.embedded import new_cluster_id


def test_cluster_ids_never_start_with_a_dash() -> None:
    # 1 in 64 random ids starts with '-', which Tansu's argument parser takes for an option
    # ("a value is required for '--cluster-id'"); 5,000 draws hit that about 78 times.
    ids = [new_cluster_id() for _ in range(5000)]
    assert not [i for i in ids if i.startswith("-")]
    assert len(set(ids)) == len(ids)
    for cluster_id in ids[:50]:
        assert len(cluster_id) == 22
        assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16
