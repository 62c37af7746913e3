"""``pyrula-fleet``'s commands: start a supervised fleet of worker processes, or look at one
(``pyrula.cli.fleet`` is the entry point that runs them)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import sys
import tempfile
from typing import Any, NoReturn
from urllib.parse import urlsplit

import click

from pyrula import logs
from pyrula.apps import AppError
from pyrula.cli.common import (
    InputError,
    checked_store_url,
    fail,
    flag_named,
    json_argument,
    run_group,
)
from pyrula.cli.fleet_control import status, upgrade
from pyrula.config.fleet import (
    FleetOptions,
    parse_memory,
    parse_seconds,
    resolve_bounds,
    resolve_health_port,
    resolve_store_url,
)
from pyrula.config.parse import parse_int
from pyrula.config.store_url import shown_url
from pyrula.config.worker import WorkerOptions
from pyrula.errors import ConfigurationError
from pyrula.supervisor.capacity import host_room, refusal
from pyrula.supervisor.memory import log_limits, read_cgroup_memory_limit, resolve_limits

logger = logging.getLogger(__name__)

#: The fleet's defaults, for the flags left unset and their help.
DEFAULTS = FleetOptions
#: WorkerOptions the fleet sets itself (one health port for the fleet; its own drain).
FLEET_OWNED = {"health_port", "health_host", "shutdown_grace", "cancel_timeout"}
#: More children than this many per CPU core is warned about (``fleet_oversized``): they
#: contend for the cores instead of adding throughput, and a drain waits for all of them.
CHILDREN_PER_CPU = 4


def shared_store_url(url: str) -> str:
    """``url``, unless it names a store the fleet's processes cannot share: ``memory://`` is
    private to one process, so each child would get its own and nothing else could reach
    the runs."""
    if "://" in url and urlsplit(url).scheme.lower() == "memory":
        raise ConfigurationError(
            "the store URL memory:// is private to one process: each child would get its own "
            "store and nothing else could reach its runs; use sqlite:///path/to/file.db "
            "(one host) or a Valkey URL such as redis://host:6379"
        )
    return url


def given_as(param: str, flag: str, variable: str) -> str:
    """How a refusal names an option: its flag, or its variable when that is where the
    value came from (the one the user must fix)."""
    source = click.get_current_context().get_parameter_source(param)
    return variable if source is click.core.ParameterSource.ENVIRONMENT else flag


def worker_options_checked(given: dict[str, Any]) -> None:
    """The worker options given as flags, checked here in the parent."""
    try:
        WorkerOptions(**given)
    except ConfigurationError as exc:
        raise InputError(flag_named(str(exc))) from None


def warn_if_oversized(children: int, cpus: int | None) -> None:
    """Log ``fleet_oversized`` when ``children`` exceeds ``CHILDREN_PER_CPU`` per core. The
    fleet still starts: the operator may know better (children that mostly wait on I/O)."""
    if cpus is None or children <= CHILDREN_PER_CPU * cpus:
        return
    logger.warning("fleet_oversized: %d children on %d CPU cores (more than %d per core); "
                   "they will contend for the cores and a drain waits for every one; "
                   "starting anyway", children, cpus, CHILDREN_PER_CPU,
                   extra={"event": "fleet_oversized", "children": children, "cpus": cpus})


def worker_option_flags(func: Any) -> Any:
    for field in reversed(dataclasses.fields(WorkerOptions)):
        if field.name in FLEET_OWNED:
            continue
        flag = "--" + field.name.replace("_", "-")
        if field.type in ("bool", bool):
            func = click.option(f"{flag}/--no-{field.name.replace('_', '-')}", field.name,
                                default=None, help=f"worker option (default {field.default})")(func)
        else:
            func = click.option(flag, field.name, default=None, metavar="VALUE",
                                help=f"worker option (default {field.default})")(func)
    return func


@click.group()
@click.version_option(package_name="pyrula")
def cli() -> None:
    """pyrula-fleet: run N supervised workflow workers on this host."""


@cli.command("start")
@click.option("-n", "children", default=None, envvar="PYRULA_CHILDREN", metavar="N",
              help="worker processes (default $WEB_CONCURRENCY, else 2; with --min/--max: "
              "the start size, default --min)")
@click.option("--min", "min_children", default=None, envvar="PYRULA_MIN_CHILDREN", metavar="N",
              help="elastic sizing: never fewer children (with --max)")
@click.option("--max", "max_children", default=None, envvar="PYRULA_MAX_CHILDREN", metavar="M",
              help="elastic sizing: never more children (with --min)")
@click.option("--scale-up-after", default=None, envvar="PYRULA_SCALE_UP_AFTER",
              metavar="SECONDS", help="elastic: add a child when the oldest queued run waited "
              f"this long ({DEFAULTS.scale_up_after:g})")
@click.option("--scale-down-after", default=None, envvar="PYRULA_SCALE_DOWN_AFTER",
              metavar="SECONDS", help="elastic: remove a child after every child was idle "
              f"this long ({DEFAULTS.scale_down_after:g})")
@click.option("--app", "apps", multiple=True, envvar="PYRULA_APP", metavar="MODULE",
              help="import this module so its @workflow functions register (repeatable)")
@click.option("--workflow", "workflows", multiple=True, metavar="MODULE:FN",
              help="serve only this @workflow (repeatable)")
@click.option("--store", default=None, metavar="URL",
              help="store URL (default $PYRULA_STORE_URL, else sqlite:///pyrula.db)")
@click.option("--namespace", default=None, envvar="PYRULA_VALKEY_NAMESPACE")
@click.option("--cluster/--no-cluster", default=None, help="force the Valkey cluster client")
@click.option("--health-port", default=None, envvar="PYRULA_HEALTH_PORT",
              help="the fleet's probe port (default $PORT, else 8081; 0 picks a free one)")
@click.option("--health-host", default=DEFAULTS.health_host, envvar="PYRULA_HEALTH_HOST",
              show_default=True)
@click.option("--dashboard-actions/--no-dashboard-actions", default=False,
              envvar="PYRULA_DASHBOARD_ACTIONS", show_default=True,
              help="let the dashboard on the health port retry, cancel and signal runs "
              "(read-only without it)")
@click.option("--max-runs-per-child", default=None, envvar="PYRULA_MAX_RUNS_PER_CHILD",
              help="recycle a child after this many runs (with jitter)")
@click.option("--max-memory-per-child", default=None, envvar="PYRULA_MAX_MEMORY_PER_CHILD",
              help="recycle a child above this RSS, e.g. 512MB (default in a container "
              "with a memory limit: 80 % of its share)")
@click.option("--memory-hard-limit", default=None, envvar="PYRULA_MEMORY_HARD_LIMIT",
              metavar="BYTES",
              help="kill a child above this RSS at once, e.g. 768MB; above "
              "--max-memory-per-child (default in a container with a memory limit: 90 % "
              "of its share)")
@click.option("--child-timeout", default=None, envvar="PYRULA_CHILD_TIMEOUT",
              help="kill and replace a child whose loop sent no heartbeat this long "
              f"({DEFAULTS.child_timeout:g})")
@click.option("--stall-timeout", default=None, envvar="PYRULA_STALL_TIMEOUT",
              help="recycle a child that claimed nothing this long with free slots "
              f"({DEFAULTS.stall_timeout:g})")
@click.option("--max-boot-failures", default=None, envvar="PYRULA_MAX_BOOT_FAILURES",
              help="children in a row that die before ready, then the fleet stops "
              f"({DEFAULTS.max_boot_failures})")
@click.option("--drain-deadline", default=None, envvar="PYRULA_DRAIN_DEADLINE",
              metavar="SECONDS", help="in an upgrade, how long the old generation keeps runs "
              "the new code cannot replay (default: until they end)")
@click.option("--shutdown-grace", default=None, envvar="PYRULA_SHUTDOWN_GRACE",
              help=f"seconds in-flight runs get to finish on SIGTERM ({DEFAULTS.shutdown_grace:g})")
@click.option("--cancel-timeout", default=None, envvar="PYRULA_CANCEL_TIMEOUT",
              help="bound on cancelling what is left, and on threads "
              f"({DEFAULTS.cancel_timeout:g})")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text",
              envvar="PYRULA_LOG_FORMAT", show_default=True)
@click.option("--log-level", default="INFO", envvar="PYRULA_LOG_LEVEL", show_default=True)
@worker_option_flags
def start(children: Any, min_children: Any, max_children: Any, scale_up_after: Any,
          scale_down_after: Any, apps: tuple[str, ...], workflows: tuple[str, ...],
          store: str | None, namespace: str | None, cluster: bool | None,
          health_port: Any, health_host: str, dashboard_actions: bool, max_runs_per_child: Any,
          max_memory_per_child: Any, memory_hard_limit: Any, child_timeout: Any,
          stall_timeout: Any, max_boot_failures: Any, drain_deadline: Any,
          shutdown_grace: Any, cancel_timeout: Any, log_format: str, log_level: str,
          **worker_options: Any) -> None:
    """Start N worker processes and supervise them until SIGTERM/SIGINT."""
    logs.configure(log_format, log_level)
    given = {k: v for k, v in worker_options.items() if v is not None}
    worker_options_checked(given)  # bad worker option values fail here, in the parent
    bounds = resolve_bounds(children, min_children, max_children, scale_up_after,
                            scale_down_after, given_as("children", "-n", "PYRULA_CHILDREN"))
    # The most children there can be: the container's memory is shared among them.
    count = bounds.get("max_children") or bounds["children"]
    too_many = refusal("--max" if bounds.get("max_children") else "-n", count,
                       host_room(read_cgroup_memory_limit()))
    if too_many is not None:
        raise InputError(too_many)
    memory = resolve_limits(
        parse_memory(max_memory_per_child),
        parse_memory(memory_hard_limit, "--memory-hard-limit"),
        read_cgroup_memory_limit(), count)
    options = FleetOptions(
        **bounds,
        apps=apps,
        workflows=workflows,
        store_url=shared_store_url(resolve_store_url(store)),
        namespace=namespace,
        cluster=cluster,
        health_port=resolve_health_port(
            health_port, given_as("health_port", "--health-port", "PYRULA_HEALTH_PORT")),
        health_host=health_host,
        dashboard_actions=dashboard_actions,
        max_runs_per_child=(None if max_runs_per_child in (None, "") else
                            parse_int("--max-runs-per-child", max_runs_per_child, minimum=1)),
        max_memory_per_child=memory.soft,
        memory_hard_limit=memory.hard,
        child_timeout=parse_seconds("--child-timeout", child_timeout, DEFAULTS.child_timeout),
        stall_timeout=parse_seconds("--stall-timeout", stall_timeout, DEFAULTS.stall_timeout),
        max_boot_failures=(DEFAULTS.max_boot_failures if max_boot_failures in (None, "")
                           else parse_int("--max-boot-failures", max_boot_failures,
                                          minimum=1)),
        drain_deadline=(None if drain_deadline in (None, "") else
                        parse_seconds("--drain-deadline", drain_deadline, 0.0)),
        shutdown_grace=parse_seconds("--shutdown-grace", shutdown_grace,
                                     DEFAULTS.shutdown_grace, strict=False),
        cancel_timeout=parse_seconds("--cancel-timeout", cancel_timeout,
                                     DEFAULTS.cancel_timeout, strict=False),
        log_format=log_format,
        log_level=log_level,
        worker_options=given,
    )
    checked_store_url(store)
    warn_if_oversized(options.max_children or options.children, os.cpu_count())
    log_limits(memory, count)
    code = run_fleet(options)
    sys.exit(code)


def run_fleet(options: FleetOptions) -> int:
    from pyrula.supervisor import prestart
    from pyrula.supervisor.children import Spawner

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    spec = prestart.fork_server_spec(list(options.apps), list(options.workflows),
                                     options.store_url, os.getcwd())
    early = prestart.EARLY
    with contextlib.ExitStack() as cleanup:
        if early is not None and early.spec == spec:
            scratch = early.scratch
            cleanup.callback(shutil.rmtree, scratch, True)
        else:
            scratch = cleanup.enter_context(tempfile.TemporaryDirectory(prefix="pyrula-fleet-"))
        check = {**spec["check"], "report": os.path.join(scratch, prestart.REPORT)}
        spawner = Spawner(preload=spec["preload"], check=check)
        if early is not None and early.spec != spec:
            # Started from a quick read of the arguments that the options contradict: not
            # the app to fork children from.
            shutil.rmtree(early.scratch, ignore_errors=True)
            spawner.replace_server()
        # The fork server starts (and imports the app) before this process opens anything,
        # and before it imports asyncio: the two imports run side by side.
        spawner.warm()
        import asyncio

        _serving_imports(options.store_url)  # meanwhile, while the fork server loads the app
        spawner.start_tracker()  # then, with this process's imports done

        try:
            outcome = spawner.checked()
            if outcome is not None and not outcome["ok"]:
                # Refused once, before any child is forked: every child would fail the same.
                raise AppError(str(outcome["message"]), str(outcome.get("frames") or ""))
            return asyncio.run(_serve(options, spawner))
        finally:
            spawner.close()


def _serving_imports(store_url: str) -> None:
    """Import what ``_serve`` needs (the supervisor, its health port, the store's backend)
    while the fork server imports the app, rather than after it: both are on the way to the
    first child."""
    import importlib

    from pyrula.config.schemes import backend_module

    backend = backend_module(store_url)
    for name in ("pyrula.supervisor.supervisor", "pyrula.supervisor.web", "pyrula.health_http",
                 *([backend] if backend else [])):
        importlib.import_module(name)


async def _serve(options: FleetOptions, spawner: Any) -> int:
    from pyrula.health_http import bind_failure
    from pyrula.supervisor.supervisor import Supervisor
    from pyrula.supervisor.web import HealthPort
    from pyrula.workflows.stores import store_from_url

    store_options: dict[str, Any] = {}
    if options.namespace:
        store_options["namespace"] = options.namespace
    if options.cluster is not None:
        store_options["cluster"] = options.cluster
    store = store_from_url(options.store_url, **store_options)
    supervisor = Supervisor(options, spawner, store)
    probes = HealthPort(supervisor, options.health_host, options.health_port)
    try:
        probes.bind()  # a port in use fails here, before any fork; served once they are
    except OSError as exc:
        await store.aclose()
        raise ConfigurationError(
            f"cannot serve the fleet's health probes on {options.health_host}:"
            f"{options.health_port}: {bind_failure(options.health_host, options.health_port, exc)}"
            "; --health-port 0 picks a free one"
        ) from None

    async def serve_port() -> None:
        try:
            host, port = await probes.start()
        except Exception:  # the children serve on; what they do is only not visible
            logger.exception("health_port_failed: the fleet serves on without its health "
                             "port", extra={"event": "health_port_failed"})
            return
        _announce(options, host, port, probes.dashboard)

    supervisor.serve_port = serve_port
    try:
        code = await supervisor.run()
        await supervisor.port_served()
        return code
    finally:
        await probes.close()
        await store.aclose()


def _announce(options: FleetOptions, host: str, port: int, dashboard_served: bool) -> None:
    """The fleet's banner: its size, its store, its health port and dashboard."""
    children = f"{options.children} {'child' if options.children == 1 else 'children'}"
    size = (f"{children} (elastic {options.min_children}..{options.max_children})"
            if options.elastic else children)
    shown = f"[{host}]" if ":" in host else host
    dashboard = (f"dashboard on http://{shown}:{port}/"
                 + ("" if options.dashboard_actions else " (read-only)")
                 if dashboard_served else "no dashboard (pip install 'pyrula[http]')")
    where = shown_url(options.store_url)
    logs.announce(f"pyrula-fleet: {size} on {where}; health on http://{host}:{port} "
                  f"(/livez /readyz /status /metrics); {dashboard}", "fleet_banner",
                  store=where, health=f"http://{host}:{port}")


BENCH_EPILOG = """\b
Modes (pick at most one; without either, all --runs are queued first and then the fleet
is started, its start-up included in the time):
  --rate R         submit R runs/s (open loop) to a ready fleet
  --concurrency C  keep C runs in flight: submit the next when one ends
Prints a live progress line on stderr, then a report: runs/s, submit -> result latency,
run duration, each child's share, shard balance, store commands per run (Valkey), kills.
Every run's result is checked (x + steps): exit 1 on a lost, failed or wrong run, 2 on a
usage error. See docs/deployment.md, "Load-testing a fleet with pyrula-fleet bench".

\b
Your own workflow, on the fleet you run it on:
  pyrula-fleet bench --attach http://127.0.0.1:8081 --workflow orders.place \\
      --params '{"sku": "A1"}' --expect '{"ok": true}' --concurrency 16
Each run must complete (and, with --expect, return that JSON value); --steps,
--step-kind, --payload-bytes and --verify shape the built-in workflow only.
"""


@cli.command("bench", epilog=BENCH_EPILOG)
@click.option("-n", "children", default=2, show_default=True, type=int, metavar="N",
              help="worker processes of the fleet the bench starts (ignored with --attach)")
@click.option("--runs", default=10000, show_default=True, type=int, help="runs to submit")
@click.option("--steps", default=3, show_default=True, type=int,
              help="journaled x + 1 steps per run")
@click.option("--store", default=None, metavar="URL",
              help="store URL (default: a fresh SQLite file in a temporary directory; with "
              "--attach: $PYRULA_STORE_URL, else sqlite:///pyrula.db, like the fleet)")
@click.option("--namespace", default=None, metavar="NS",
              help="Valkey key namespace (default: a fresh one for the bench's own fleet; "
              "with --attach: $PYRULA_VALKEY_NAMESPACE, else default, like the fleet)")
@click.option("--step-kind", type=click.Choice(["async", "sync"]), default="async",
              show_default=True,
              help="async def steps (on the worker's loop) or def steps (its thread pool)")
@click.option("--payload-bytes", default=0, show_default=True, type=int, metavar="N",
              help="params carry a string of N bytes")
@click.option("--rate", default=None, type=float, metavar="R",
              help="submit R runs per second, evenly spread, while the fleet runs")
@click.option("--concurrency", default=None, type=int, metavar="C",
              help="keep C runs in flight: submit a new one when one ends")
@click.option("--attach", default=None, metavar="URL",
              help="load the running fleet whose health port is URL (e.g. "
              "http://127.0.0.1:8081) instead of starting one; it must serve "
              "pyrula.examples.bench (or --workflow) on the same store")
@click.option("--workflow", default=None, metavar="NAME",
              help="with --attach: load the fleet with runs of this workflow of yours (one "
              "it serves) instead of the built-in pyrula.bench")
@click.option("--params", "params_json", default=None, metavar="JSON",
              help="with --workflow: each run's params, a JSON document (default {})")
@click.option("--expect", "expect_json", default=None, metavar="JSON",
              help="with --workflow: each run's result must equal this JSON value (default: "
              "any result of a completed run)")
@click.option("--min", "min_children", default=None, type=int, metavar="N",
              help="start the bench's fleet elastic from --min N (-n is its start size)")
@click.option("--max", "max_children", default=None, type=int, metavar="M",
              help="... up to --max M children")
@click.option("--upgrade-every", default=None, type=float, metavar="SECONDS",
              help="SIGUSR2 the fleet this often: upgrades under the load")
@click.option("--kill-every", default=None, type=float, metavar="SECONDS",
              help="SIGKILL a random ready child every SECONDS while the load runs (with "
              "--attach: the fleet must run on this host)")
@click.option("--lost-after", default=30.0, show_default=True, type=float, metavar="SECONDS",
              help="runs still open when no run has ended for this long are lost")
@click.option("--verify", is_flag=True,
              help="each step records what it ran in a side-effect ledger; after the load "
              "check journals and ledger: nothing lost, nothing completed twice, no recorded "
              "step run again (exit 1 otherwise)")
@click.option("--ledger", default=None, metavar="DIR",
              help="with --verify: the ledger's directory (default: a temporary one); an "
              "attached fleet's processes must be able to write there")
@click.option("--json", "json_path", default=None, metavar="PATH",
              help="also write every figure here as JSON ('-': print the JSON instead of "
              "the report)")
@click.pass_context
def bench(ctx: click.Context, children: int, runs: int, steps: int, store: str | None,
          namespace: str | None, step_kind: str, payload_bytes: int, rate: float | None,
          concurrency: int | None, attach: str | None, min_children: int | None,
          max_children: int | None, upgrade_every: float | None, kill_every: float | None,
          lost_after: float, verify: bool, ledger: str | None, workflow: str | None,
          params_json: str | None, expect_json: str | None, json_path: str | None) -> None:
    """Load a fleet with RUNS runs of STEPS steps and measure it.

    Starts a fleet of N children on the store (or attaches to a running one), submits the
    runs, waits for every result, and reports what a fleet is sized by.
    """
    from pyrula.cli.bench import BenchConfig, BenchError, render, run_bench
    from pyrula.cli.bench.expect import Expected

    given = [f"--{name.replace('_', '-')}" for name in ("steps", "step_kind")
             if ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE]
    if workflow is None and (params_json is not None or expect_json is not None):
        _bench_error("--params and --expect go with --workflow NAME")
    if workflow is not None and given:
        _bench_error(f"{given[0]} shapes the built-in workflow's runs: not with --workflow "
                     "(each run's params are --params)")
    try:
        config = BenchConfig(
            workflow=workflow,
            params={} if params_json is None else _json_flag("--params", params_json),
            expect=None if expect_json is None else Expected(_json_flag("--expect",
                                                                          expect_json)),
            children=children, runs=runs, steps=steps, store_url=store, namespace=namespace,
            step_kind=step_kind, payload_bytes=payload_bytes, rate=rate,
            concurrency=concurrency, attach=attach, kill_every=kill_every,
            min_children=min_children, max_children=max_children,
            upgrade_every=upgrade_every, lost_after=lost_after, verify=verify, ledger=ledger,
        )
    except BenchError as exc:
        _bench_error(str(exc))
    if json_path not in (None, "-"):
        directory = os.path.dirname(os.path.abspath(json_path))
        if not os.path.isdir(directory) or os.path.isdir(json_path):
            raise click.UsageError(f"--json {json_path!r}: no such directory, or a directory")
    if attach and ctx.get_parameter_source("children") is click.core.ParameterSource.COMMANDLINE:
        click.echo("pyrula-fleet bench: -n is ignored with --attach (the fleet has its own "
                   "children)", err=True)
    try:
        figures = run_bench(config)
    except BenchError as exc:
        fail(str(exc), exc.code)
    if json_path == "-":
        click.echo(json.dumps(figures, indent=2))
    else:
        click.echo(render(figures))
        if json_path:
            with open(json_path, "w") as out:
                json.dump(figures, out, indent=2)
    if not figures["verification"]["ok"]:
        if figures.get("fleet_log_tail"):
            click.echo(f"pyrula-fleet bench: the fleet's last output:\n{figures['fleet_log_tail']}",
                       err=True)
        sys.exit(1)


def _bench_error(message: str) -> NoReturn:
    """A usage error of the bench: one line on stderr, exit 2."""
    raise InputError(message)


def _json_flag(flag: str, text: str) -> Any:
    return json_argument(flag, text)


cli.add_command(status)
cli.add_command(upgrade)


def main() -> None:
    run_group(cli)
