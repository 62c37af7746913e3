"""The build: a fingerprint of the workflow code, the same in every process for the same
code, another for any edit; pinned by PYRULA_BUILD_ID; recorded in every run:started and
reported in a fleet child's heartbeat."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from pyrula.errors import ConfigurationError
from pyrula.wire import Heartbeat, WorkerState, decode, heartbeat_message, parse_heartbeat
from pyrula.workflows import (
    InlineWorkflowRunner,
    MemoryStore,
    WorkflowContext,
    WorkflowWorker,
    step,
    workflow,
)
from pyrula.workflows.build import BUILD_ENV, build_id, fingerprint
from pyrula.workflows.definition import REGISTRY, StepSpec, WorkflowSpec
from tests.unit.worker.worker_support import fast_options, serving

REPO = Path(__file__).resolve().parents[2]

APP = '''
from pyrula.workflows import WorkflowContext, step, workflow


@step(name="build.charge", retries=RETRIES)
def charge(order: str) -> str:
    return "receipt-" + order


@workflow(name="build.order")
async def order(ctx: WorkflowContext, params: dict) -> str:
    return await charge(params["order"])
'''


def app_build(tmp_path: Path, module: str, source: str) -> str:
    """The fingerprint of the app ``source``, imported as ``module`` from its own file."""
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
    sys.path.insert(0, str(tmp_path))
    try:
        mod = importlib.import_module(module)
    finally:
        sys.path.remove(str(tmp_path))
    return fingerprint([mod.order.__pyrula_workflow__, mod.charge.__pyrula_step__])


def test_the_same_code_gives_the_same_build_and_any_edit_another(tmp_path: Path) -> None:
    base = app_build(tmp_path, "build_app_1", APP.replace("RETRIES", "0"))
    same = app_build(tmp_path, "build_app_2", APP.replace("RETRIES", "0"))
    edited_step = app_build(tmp_path, "build_app_3",
                            APP.replace("RETRIES", "0").replace('"receipt-"', '"r-"'))
    edited_options = app_build(tmp_path, "build_app_4", APP.replace("RETRIES", "3"))
    edited_workflow = app_build(tmp_path, "build_app_5", APP.replace("RETRIES", "0").replace(
        'return await charge(params["order"])', 'return await charge(params["id"])'))

    assert len(base) == 12 and int(base, 16) >= 0
    assert same == base
    assert len({base, edited_step, edited_options, edited_workflow}) == 4


def test_the_build_is_the_same_in_another_process(tmp_path: Path) -> None:
    """A fresh interpreter (another hash seed) importing the same code gets the same build,
    from the source of real modules and from the compiled code of functions without any."""
    script = textwrap.dedent('''
        import sys
        from pyrula.workflows.build import fingerprint
        from pyrula.workflows.definition import REGISTRY
        import tests.golden.workflows  # real modules: their source
        namespace = {}
        exec(compile(
            "async def nosource(ctx, params):\\n"
            "    if params in {'a', 'b', 'c', 'd'}:\\n"
            "        return [x for x in (1, 2.5, 'z')]\\n",
            "<generated>", "exec"), namespace)
        from pyrula.workflows.definition import WorkflowSpec
        specs = [*REGISTRY.workflows().values(), *REGISTRY.steps().values()]
        print(fingerprint(specs), fingerprint([WorkflowSpec("gen", namespace["nosource"])]))
    ''')
    outputs = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO)}
        env.pop(BUILD_ENV, None)
        done = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=60, check=True)
        outputs.add(done.stdout.strip())
    assert len(outputs) == 1, outputs
    golden, generated = outputs.pop().split()
    import tests.golden.workflows  # here too, under this process's hash seed

    golden_module = tests.golden.workflows.__name__
    ours = [spec for spec in [*REGISTRY.workflows().values(), *REGISTRY.steps().values()]
            if spec.fn.__module__ == golden_module]
    assert fingerprint(ours) == golden
    assert len(generated) == 12


def test_functions_without_source_are_told_apart_by_their_code() -> None:
    def compiled(body: str) -> Any:
        namespace: dict[str, Any] = {}
        exec(compile(f"async def wf(ctx, params):\n    {body}\n", "<generated>", "exec"),
             namespace)
        return namespace["wf"]

    one = fingerprint([WorkflowSpec("gen", compiled("return params['a']"))])
    same = fingerprint([WorkflowSpec("gen", compiled("return params['a']"))])
    other_constant = fingerprint([WorkflowSpec("gen", compiled("return params['b']"))])
    other_call = fingerprint([WorkflowSpec("gen", compiled("return other(params)"))])

    assert one == same
    assert len({one, other_constant, other_call}) == 3


def test_names_and_kinds_count_and_order_does_not() -> None:
    async def body(ctx: WorkflowContext, params: Any) -> Any:
        return params

    def fn() -> None:
        pass

    wf, st = WorkflowSpec("x", body), StepSpec("y", fn, is_async=False)

    assert fingerprint([wf, st]) == fingerprint([st, wf])
    assert fingerprint([wf, st]) != fingerprint([WorkflowSpec("x2", body), st])
    assert fingerprint([StepSpec("x", fn, is_async=False)]) != fingerprint(
        [WorkflowSpec("x", fn)])  # type: ignore[arg-type]


def test_pyrula_build_id_pins_the_build() -> None:
    specs = [*REGISTRY.workflows().values()]

    assert build_id(specs, {BUILD_ENV: "release-42"}) == "release-42"
    assert build_id(specs, {BUILD_ENV: "  v1.2.3+abc  "}) == "v1.2.3+abc"
    assert build_id(specs, {BUILD_ENV: "   "}) == fingerprint(specs)
    assert build_id(specs, {}) == fingerprint(specs)
    with pytest.raises(ConfigurationError, match="PYRULA_BUILD_ID must be at most 128"):
        build_id(specs, {BUILD_ENV: "two words"})
    with pytest.raises(ConfigurationError, match="PYRULA_BUILD_ID"):
        build_id(specs, {BUILD_ENV: "x" * 129})


@step(name="build_test.add")
def add(a: int, b: int) -> int:
    return a + b


@workflow(name="build_test.wf")
async def build_wf(ctx: WorkflowContext, params: Any) -> Any:
    return await add(params, 1)


async def test_a_worker_records_its_build_in_run_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(BUILD_ENV, raising=False)
    store = MemoryStore()
    worker = WorkflowWorker(store=store, workflows=[build_wf], options=fast_options(),
                            cloud=False)
    assert worker.build == fingerprint(
        [REGISTRY.workflow("build_test.wf"), *REGISTRY.steps().values()])
    run = await worker.client.submit("build_test.wf", 1)

    async with serving(worker):
        assert await worker.client.result(run.run_id, timeout=10) == 2

    [started] = [e for e in await store.read_events(run.run_id) if e["type"] == "run:started"]
    assert started["build"] == worker.build


async def test_a_pinned_build_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BUILD_ENV, "deploy-7")
    store = MemoryStore()
    worker = WorkflowWorker(store=store, workflows=[build_wf], options=fast_options(),
                            cloud=False)
    given = WorkflowWorker(store=store, workflows=[build_wf], cloud=False, build="given-1")
    runner = InlineWorkflowRunner(store=store, workflows=[build_wf], cloud=False)
    first = await worker.client.submit("build_test.wf", 1)
    second = await worker.client.submit("build_test.wf", 2)

    async with serving(worker):
        await worker.client.result(first.run_id, timeout=10)
    await runner.run("build_test.wf", second.run_id)

    assert (worker.build, given.build, runner.build) == ("deploy-7", "given-1", "deploy-7")
    for run_id in (first.run_id, second.run_id):
        events = await store.read_events(run_id)
        assert [e.get("build") for e in events if e["type"] == "run:started"] == ["deploy-7"]
    with pytest.raises(ConfigurationError, match="build must be"):
        WorkflowWorker(store=store, workflows=[build_wf], cloud=False, build="a b")


def test_the_heartbeat_carries_the_build() -> None:
    beat = Heartbeat(state=WorkerState.READY, worker_id="w", pid=1, build="abc123def456")

    assert parse_heartbeat(decode(heartbeat_message(beat))).build == "abc123def456"
    older = decode(heartbeat_message(Heartbeat(state=WorkerState.READY, worker_id="w", pid=1)))
    del older["build"]
    assert parse_heartbeat(older).build == ""


def test_a_fleet_childs_heartbeat_names_its_workers_build(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pyrula.workflows.worker.child import Reports, StoreCheck

    monkeypatch.setenv(BUILD_ENV, "child-build")
    worker = WorkflowWorker(store=MemoryStore(), workflows=[build_wf], cloud=False)

    reports = Reports(None, None)  # type: ignore[arg-type]  # a heartbeat sends nothing
    beat = parse_heartbeat(decode(reports.heartbeat(worker, StoreCheck())))

    assert beat.build == "child-build"
