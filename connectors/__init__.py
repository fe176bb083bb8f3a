"""The programming model (Computation, Context, Topology) and its Spark runtime."""

from millstream.connectors.computation import Computation, Context
from millstream.connectors.topology import ComputationOptions, Topology

__all__ = ["Computation", "ComputationOptions", "Context", "Topology"]
