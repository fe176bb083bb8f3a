"""A fault hook (`MILLSTREAM_TEST_FAULT_HOOK=tests.e2e.task_retry_hook:hook`) that kills the
Python process running a shard task of computation TASK_RETRY_COMPUTATION right after its
commit, once (TASK_RETRY_MARKER, a file created exclusively, says it happened): the Spark task
fails after its effects are in Redis, and Spark runs it again (a master with retries,
`local[N,M]`). Only that process dies, not the pipeline. With TASK_RETRY_ARM set, the hook does
nothing until that file exists: a test arms it once the pipeline has settled what came before."""

from __future__ import annotations

import os


def hook(name: str) -> None:
    if name != f"after_commit_{os.environ['TASK_RETRY_COMPUTATION']}":
        return
    arm = os.environ.get("TASK_RETRY_ARM")
    if arm and not os.path.exists(arm):
        return
    try:
        fd = os.open(os.environ["TASK_RETRY_MARKER"], os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.write(fd, f"{os.getpid()}\n".encode())
    os.close(fd)
    os._exit(17)
