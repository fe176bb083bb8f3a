"""The fused query's plan as data: each named pass decides one thing, and the passes in order
give every stage its fusion position, consumers, delivery targets and topic inputs."""

from __future__ import annotations

import pytest

from millstream import Computation, ConfigurationError, Context, Record, Topology, kafka_source
from millstream.connectors.stage_plan import (
    PASSES,
    PlanContext,
    bare_stage,
    fusion_order,
    plan_stages,
    topological_order,
)
from millstream.connectors.targets import Endpoints, InternalStreamSink, UserSink
from millstream.settings import Settings
from millstream.sinks import FileSink


class Noop(Computation):
    def process_record(self, ctx: Context, record: Record) -> None:
        pass


def _topology() -> Topology:
    t = Topology("app").source("in", kafka_source("in"))
    # Declared consumers first: fusion order must still put producers before them.
    t.computation("c", Noop(), inputs=["b_out"], outputs=["c_out"])
    t.computation("b", Noop(), inputs=["a_out"], outputs=["b_out"])
    t.computation("a", Noop(), inputs=["in"], outputs=["a_out"])
    t.sink("c_out", FileSink("/tmp/unused"))
    t.publish("a_out")
    return t


def _ctx(topology: Topology) -> PlanContext:
    return PlanContext(
        topology, Settings(), Endpoints("redis://127.0.0.1:9/0", {"bootstrap.servers": "x:1"})
    )


def test_the_passes_in_order_wire_a_three_stage_query() -> None:
    ctx = _ctx(_topology())
    stages = plan_stages(ctx, ["c", "b", "a"])
    assert list(stages) == ["a", "b", "c"]
    a, b, c = stages["a"], stages["b"], stages["c"]
    assert a.consumers == {"a_out": ["b"]} and b.consumers == {"b_out": ["c"]}
    assert c.consumers == {}
    # a_out is published: its topic is a target though b consumes it here.
    assert [type(t.factory) for t in a.targets["a_out"]] == [InternalStreamSink]
    assert b.targets["b_out"] == ()  # consumed here only: never touches Kafka
    assert [type(t.factory) for t in c.targets["c_out"]] == [UserSink]
    assert all(
        s.topic_inputs == frozenset() and s.elsewhere == frozenset() for s in stages.values()
    )


def test_a_query_of_some_computations_reads_the_others_through_topics() -> None:
    ctx = _ctx(_topology())
    stages = plan_stages(ctx, ["c"])
    assert stages["c"].topic_inputs == {"b_out"}
    upstream = plan_stages(ctx, ["a", "b"])
    assert upstream["b"].elsewhere == {"b_out"} and upstream["b"].consumers == {}
    assert [type(t.factory) for t in upstream["b"].targets["b_out"]] == [InternalStreamSink]


def test_a_pass_is_one_entry_and_sees_the_stages_so_far() -> None:
    ctx = _ctx(_topology())
    seen: list[list[str]] = []

    def record(stages: list, ctx: PlanContext) -> list:
        seen.append([s.name for s in stages])
        return stages

    plan_stages(ctx, ["c", "b", "a"], passes=(*PASSES, record))
    assert seen == [["a", "b", "c"]]
    bare = [bare_stage(ctx.topology.computations[n], ctx) for n in ("b", "a")]
    assert [s.name for s in fusion_order(bare, ctx)] == ["a", "b"]


def test_a_cycle_is_refused_with_its_members() -> None:
    t = Topology("app").source("in", kafka_source("in"))
    t.computation("x", Noop(), inputs=["in", "y_out"], outputs=["x_out"])
    t.computation("y", Noop(), inputs=["x_out"], outputs=["y_out"])
    with pytest.raises(ConfigurationError, match=r"\['x', 'y'\] form a cycle"):
        topological_order(t, ["x", "y"])
