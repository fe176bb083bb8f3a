"""Unit tests of the page-views pipeline: in memory with TopologyTestDriver (no Spark, Redis,
Kafka or Java needed; `pip install millstream pytest` is enough)."""

from __future__ import annotations

import json
from typing import Any

from examples.page_views.pipeline import build
from millstream.testing import TopologyTestDriver

MINUTE = 60_000
T0 = 1_700_000_040_000  # a minute boundary, in epoch milliseconds
OUT_OF_ORDER = 2_000  # the pipeline's max_out_of_order_ms


def driver() -> TopologyTestDriver:
    # The clock starts at T0: records far ahead of the clock would be dead-lettered.
    return TopologyTestDriver(build(output="unused: the driver does not call sinks"), start_ms=T0)


def view(d: TopologyTestDriver, page: str, at: int, view_id: str | None = None) -> None:
    d.send("page_views", {"page": page, "user": "u"}, timestamp=at, id=view_id)


def values(d: TopologyTestDriver, stream: str) -> list[Any]:
    return [json.loads(p.value) for p in d.output(stream)]


def test_each_window_reports_its_busiest_pages_once_the_watermark_passes_it() -> None:
    d = driver()
    for page, n in [("/home", 3), ("/cart", 1), ("/faq", 2), ("/blog", 2)]:
        for i in range(n):
            view(d, page, T0 + 1_000 * i)
    view(d, "/home", T0 + MINUTE + 5)  # the next window

    d.advance_watermark(T0 + MINUTE - 1 + OUT_OF_ORDER)  # the first window is not over yet
    assert d.output("top_pages") == []

    d.advance_watermark(T0 + MINUTE + OUT_OF_ORDER)  # counted, but the report is due 1 ms later
    assert len(d.output("page_counts")) == 4 and d.output("top_pages") == []
    d.advance_watermark(T0 + MINUTE + 1 + OUT_OF_ORDER)
    [top] = d.output("top_pages")
    assert top.key == str(T0)
    assert top.timestamp == T0 + MINUTE + 1
    assert json.loads(top.value) == {
        "window": T0,
        "top": [["/home", 3], ["/blog", 2], ["/faq", 2]],  # ties in page order
        "pages": 4,
        "views": 8,
    }
    counts = sorted((c["page"], c["views"]) for c in values(d, "page_counts"))
    assert counts == [("/blog", 2), ("/cart", 1), ("/faq", 2), ("/home", 3)]
    assert d.state("page_counter", "/home") == {str(T0 + MINUTE): 1}  # the open window

    d.advance_watermark(T0 + 3 * MINUTE)
    assert [v["top"] for v in values(d, "top_pages")][1] == [["/home", 1]]
    assert d.dead_letters() == []


def test_a_view_sent_twice_counts_once_and_a_late_view_is_dropped() -> None:
    d = driver()
    view(d, "/home", T0 + 10, view_id="v1")
    view(d, "/home", T0 + 10, view_id="v1")  # the producer retried
    d.advance_watermark(T0 + 30_000)
    view(d, "/home", T0 + 20_000, view_id="v2")  # behind the watermark (less the bound)
    d.advance_watermark(T0 + MINUTE + 1 + OUT_OF_ORDER)
    assert [v["views"] for v in values(d, "top_pages")] == [1]
    assert d.metrics("page_counter")["duplicates"] == 1
    assert d.late("page_counter") == 1


def test_a_view_without_a_page_is_a_dead_letter() -> None:
    d = driver()
    d.send("page_views", {"user": "u"}, timestamp=T0, id="v9")
    [letter] = [json.loads(p.value) for p in d.dead_letters()]
    assert letter["computation"] == "page_counter"
    assert letter["error"] == "key extraction failed: KeyError: 'page'"
    assert letter["record_id"] == b"v9".hex()
