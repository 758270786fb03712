"""Lowerings: linalg."""
