"""The scheduler's cache: a column-oriented NodeTable of nodes and the pods counted on them."""

from shardsched.cache.node_table import NodeTable, PodUsage

__all__ = ["NodeTable", "PodUsage"]
