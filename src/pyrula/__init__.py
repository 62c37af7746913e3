"""pyrula: a durable workflow engine for Python and the multiprocess fleet that runs it."""

__version__ = "0.1.0"
