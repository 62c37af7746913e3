"""``pyrula-fleet``: the multiprocess worker fleet (see pyrula.supervisor)."""

from __future__ import annotations

import sys

import click


def main() -> None:
    click.echo("pyrula-fleet: the fleet supervisor is not part of this build yet; "
               "run `pyrula worker` per process meanwhile", err=True)
    sys.exit(2)
