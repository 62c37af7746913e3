"""Reporting to a control plane: the connector a worker runs, and the collector it reports to.

``connector`` (with ``outbox``, its spool, and ``wire``, what goes over HTTP) lives in
every worker and inline runner; ``collector`` is ``pyrula cloud serve`` (``pyrula[http]``).
"""
