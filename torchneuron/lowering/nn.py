"""Lowerings: nn."""
