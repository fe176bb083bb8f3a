"""Strong productions' ids (`connectors/production_ids.py`): 16 bytes, never repeated within a
process, and a forked child (a Spark Python worker forks from its daemon) draws its own."""

from __future__ import annotations

import os

from millstream.connectors.production_ids import new_production_id


def test_ids_are_16_bytes_and_distinct_within_a_process() -> None:
    ids = [new_production_id() for _ in range(10_000)]
    assert all(len(i) == 16 for i in ids)
    assert len(set(ids)) == len(ids)


def test_a_forked_child_draws_a_prefix_of_its_own() -> None:
    before = new_production_id()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its next id and leave at once
        os.write(write, new_production_id())
        os._exit(0)
    os.close(write)
    child = os.read(read, 16)
    os.close(read)
    os.waitpid(pid, 0)
    after = new_production_id()
    assert len(child) == 16
    assert child[:8] != before[:8]  # another process's ids
    assert after[:8] == before[:8] and after != before  # this one goes on counting
