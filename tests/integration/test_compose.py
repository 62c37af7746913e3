"""compose.yaml, checked offline: `docker-compose config` must accept it, and it must
define what docs/deployment.md promises. No image is pulled and nothing is started (the
machines that run the suite cannot pull images)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.needs_tool(
    "docker-compose (the compose.yaml check)",
    None if shutil.which("docker-compose") else
    "no docker-compose on PATH (make system-deps installs it as root: apt-get install "
    "docker-compose)",
)


def _config(*profiles: str) -> dict[str, Any]:
    """The file as docker-compose reads it, with ``profiles`` enabled."""
    options = [arg for profile in profiles for arg in ("--profile", profile)]
    done = subprocess.run(
        ["docker-compose", "--project-directory", str(ROOT), "-f", str(ROOT / "compose.yaml"),
         *options, "config"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 0, done.stderr
    config: dict[str, Any] = yaml.safe_load(done.stdout)
    return config


def test_the_default_services_are_valkey_postgres_and_a_fleet_on_them() -> None:
    services = _config()["services"]
    assert {"valkey", "postgres", "fleet"} <= set(services)
    fleet = services["fleet"]
    assert "pyrula-fleet start" in " ".join(fleet["command"])
    assert fleet["environment"]["PYRULA_STORE_URL"] == "redis://valkey:6379"
    assert fleet["environment"]["PYRULA_POSTGRES_DSN"].startswith("postgresql://")
    assert set(fleet["depends_on"]) == {"valkey", "postgres"}
    for name in ("valkey", "postgres", "fleet"):  # `up --wait` waits for these
        assert services[name]["healthcheck"]["test"], name


def test_the_valkey_cluster_is_six_nodes_under_its_own_profile() -> None:
    service = _config("valkey-cluster")["services"]["valkey-cluster"]
    assert service["profiles"] == ["valkey-cluster"]
    script = " ".join(service["command"])
    ports = [f"127.0.0.1:{port}" for port in range(7000, 7006)]
    assert all(port in script for port in ports)
    assert "--cluster-replicas 1" in script
    published = sorted(int(p["published"]) for p in service["ports"])
    assert published == list(range(7000, 7006))
    assert "cluster_state:ok" in " ".join(service["healthcheck"]["test"])
