"""The fleet: fork and supervise worker children, aggregate their health, recover crashes.

It never imports the engine: it talks to children through exit codes, the heartbeat wire
format (``pyrula.wire``) and the store.
"""
