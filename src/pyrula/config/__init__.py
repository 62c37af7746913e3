"""Every option and PYRULA_* variable, parsed and validated in one place."""

from pyrula.config.cloud import check_cloud
from pyrula.config.parse import env_value, parse_bool, parse_bytes, parse_float, parse_int

__all__ = ["check_cloud", "env_value", "parse_bool", "parse_bytes", "parse_float", "parse_int"]
