"""Exact and semantic answer caches (issue 3); not built yet."""
