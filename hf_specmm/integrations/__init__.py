"""Integrations with other tools; each subpackage is imported only by the tool it serves (optional extras)."""
