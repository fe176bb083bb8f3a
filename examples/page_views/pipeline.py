"""Page views per page and window, then each window's busiest pages, written to JSON-lines files.

Input: a Kafka topic of page views, value `{"page": "/home", "user": "u1"}`, the Kafka timestamp
as event time and a `view-id` header as the record id (a view sent twice is counted once).

1. `PageCounter`, keyed by page: counts views per window; an event-time timer at the window's
   end emits `{"page", "window", "views"}`, stamped at that end (the timer's time).
2. `TopPages`, keyed by window: gathers the window's counts; a timer 1 ms after the window's end
   emits its busiest pages. Every count of a window is stamped at the window's end, and the
   low watermark cannot pass a count still on its way, so when that timer fires all of them are
   in: the result does not depend on how records were batched.

Run it (REDIS_URL and KAFKA_BOOTSTRAP_SERVERS set, or `--embedded` for throw-away ones):

    millstream run examples.page_views.pipeline:topology

The environment picks the input topic (PAGE_VIEWS_TOPIC, default `page-views`), the output
folder (PAGE_VIEWS_OUTPUT, default `.millstream/page_views`), the window (PAGE_VIEWS_WINDOW_MS,
default one minute) and the application name (PAGE_VIEWS_APP). Its unit tests are
`test_pipeline.py` next to this file.
"""

from __future__ import annotations

import json
import os

from millstream import Computation, Context, Record, Timer, Topology, json_field, kafka_source
from millstream.sinks import FileSink

TOP = 3  # pages per window in the result


class PageCounter(Computation):
    """Views of one page per window; the window's timer emits the count and forgets it."""

    def __init__(self, window_ms: int) -> None:
        self.window_ms = window_ms

    def process_record(self, ctx: Context, record: Record) -> None:
        start = record.timestamp - record.timestamp % self.window_ms
        counts = ctx.get_state({})
        counts[str(start)] = counts.get(str(start), 0) + 1
        ctx.set_state(counts)
        ctx.set_timer(str(start), start + self.window_ms)  # fires once the watermark passes it

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        counts = ctx.get_state({})
        views = counts.pop(timer.tag, 0)
        # Stamped at the timer's time (the default): the window's end.
        ctx.produce(
            "page_counts", ctx.key, {"page": ctx.key, "window": int(timer.tag), "views": views}
        )
        if counts:
            ctx.set_state(counts)
        else:
            ctx.delete_state()


class TopPages(Computation):
    """Keyed by window: collects its pages' counts, then emits the busiest ones."""

    def process_record(self, ctx: Context, record: Record) -> None:
        count = json.loads(record.value)
        pages = ctx.get_state({})
        pages[count["page"]] = count["views"]
        ctx.set_state(pages)
        ctx.set_timer("top", record.timestamp + 1)

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        pages = ctx.get_state({})
        ranked = sorted(pages.items(), key=lambda item: (-item[1], item[0]))
        ctx.produce(
            "top_pages",
            ctx.key,
            {
                "window": int(ctx.key),
                "top": [[page, views] for page, views in ranked[:TOP]],
                "pages": len(pages),
                "views": sum(pages.values()),
            },
        )
        ctx.delete_state()


def build(
    *,
    topic: str = "page-views",
    output: str = ".millstream/page_views",
    window_ms: int = 60_000,
    app: str = "page_views",
) -> Topology:
    """The pipeline; `topology` below is this with the environment's settings."""
    topology = Topology(app)
    topology.source(
        "page_views",
        kafka_source(topic, id_header="view-id"),
        max_out_of_order_ms=2_000,  # views may reach Kafka up to 2 s out of order
    )
    topology.computation(
        "page_counter",
        PageCounter(window_ms),
        inputs={"page_views": json_field("page")},
        outputs=["page_counts"],
    )
    topology.computation(
        "top_pages",
        TopPages(),
        inputs={"page_counts": json_field("window")},
        outputs=["top_pages"],
    )
    topology.sink("top_pages", FileSink(output, value_encoding="utf-8"))
    return topology


topology = build(
    topic=os.environ.get("PAGE_VIEWS_TOPIC", "page-views"),
    output=os.environ.get("PAGE_VIEWS_OUTPUT", ".millstream/page_views"),
    window_ms=int(os.environ.get("PAGE_VIEWS_WINDOW_MS", "60000")),
    app=os.environ.get("PAGE_VIEWS_APP", "page_views"),
)
