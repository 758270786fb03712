"""Lowerings: random."""
