"""Lowerings: foreach."""
