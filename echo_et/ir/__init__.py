"""The echo-et IR: protobuf messages (``pb``), Graph and Job wrappers, builders, I/O, checker."""

from echo_et.ir.builder import GraphBuilder, JobBuilder
from echo_et.ir.checker import Issue, check_graph
from echo_et.ir.graph import Graph
from echo_et.ir.io import iter_graph, load_job, read_graph, save_job, write_graph
from echo_et.ir.job import Job
from echo_et.ir.job_checker import assert_valid, check_job
from echo_et.ir.schema import SCHEMA_VERSION, pb

__all__ = [
    "SCHEMA_VERSION",
    "Graph",
    "GraphBuilder",
    "Issue",
    "Job",
    "JobBuilder",
    "assert_valid",
    "check_graph",
    "check_job",
    "iter_graph",
    "load_job",
    "pb",
    "read_graph",
    "save_job",
    "write_graph",
]
