"""Integrations with other libraries, each installed at import and acting only once that library loads."""
