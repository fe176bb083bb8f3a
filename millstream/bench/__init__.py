"""`millstream bench`: throughput, latency, watermark lag, dedup cost and scaling, measured.

One scenario per module (`throughput`, `latency`, `watermarks`, `dedup`, `scaling`); the
Quix Streams counterpart (`quix_app.py`) and the plain Spark baselines (`plain_spark.py`)
run as separate processes. See `cli.py` for the options.
"""
