"""`millstream chaos`: a per-key counter under a seeded schedule of real faults, verified by id."""
