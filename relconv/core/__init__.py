"""The relational map shared by both front ends; imports without torch_geometric."""

from relconv.core.relational_map import RelationalMap, index_dtype_for

__all__ = ["RelationalMap", "index_dtype_for"]
