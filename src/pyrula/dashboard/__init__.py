"""The HTML dashboard: one page, its JSON routes and a ring buffer of the fleet's figures.

Served by the fleet on its health port (``pyrula.supervisor.web``) and by a mounted
``RunRouter(store)`` (unless ``dashboard=False``). It reads the store through the store
and client modules only, never the engine or the worker, because the fleet's supervisor
serves it. Starlette is the optional extra ``pyrula[http]``: ``pyrula.dashboard.app`` needs
it; this package and ``series`` do not.
"""
