"""Every option and PYRULA_* variable, parsed and validated in one place.

The package imports nothing itself: a fleet reads one of its modules before it has
imported anything else (the store's backend, to start its fork server), and pays for that
module alone.
"""
