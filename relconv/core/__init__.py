"""The relational map shared by both front ends; imports without torch_geometric."""

from relconv.core.relational_map import RelationalMap, check_index_range, index_dtype_for, pairs_from_table

__all__ = ["RelationalMap", "check_index_range", "index_dtype_for", "pairs_from_table"]
