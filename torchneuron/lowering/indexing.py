"""Lowerings: indexing."""
