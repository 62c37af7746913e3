"""Command-line entry points: ``pyrula`` and ``pyrula-fleet``."""
