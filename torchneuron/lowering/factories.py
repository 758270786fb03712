"""Lowerings: factories."""
