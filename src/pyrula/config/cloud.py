"""Cloud reporting: no service stands behind it here, so a key without the client fails."""

from __future__ import annotations

import importlib.util
import os

from pyrula.errors import ConfigurationError


def check_cloud(cloud: bool = True) -> None:
    """Raise ConfigurationError if ``PYRULA_CLOUD_API_KEY`` asks for Cloud we cannot reach.

    With ``cloud=False`` the key is ignored.
    """
    if not cloud:
        return
    key = os.environ.get("PYRULA_CLOUD_API_KEY", "")
    if not key:
        return
    if importlib.util.find_spec("pyrula_cloud_client") is None:
        raise ConfigurationError(
            "PYRULA_CLOUD_API_KEY is set but pyrula-cloud-client is not installed: "
            "install it (pip install pyrula-cloud-client), unset PYRULA_CLOUD_API_KEY, "
            "or pass cloud=False"
        )
    raise ConfigurationError(
        "PYRULA_CLOUD_API_KEY is set, but this build of pyrula has no Cloud connector; "
        "unset it or pass cloud=False"
    )
