"""Ansible-compatible inventory: YAML groups/hosts, group_vars/, host_vars/, ``--limit``.

Public API::

    inv = load_inventory("inventories/example.yaml")   # InventoryError on any bad input
    inv.hosts                  # list[Host], inventory order
    inv.groups                 # dict[str, Group]
    inv.select("h200,!gpu-07") # list[Host], inventory order
    inv.host_vars("gpu-01")    # dict: effective_vars(host)
    effective_vars(host)       # defaults applied, templates rendered
    KNOWN_VARS                 # the table of known variables (VarSpec)
"""

from .errors import InventoryError
from .loader import load_inventory
from .model import Group, Host, Inventory
from .patterns import select_hosts, split_patterns
from .variables import (BUILTIN_PROTECTED_PROCESSES, KNOWN_VARS, SECRET_VARS, VarSpec,
                        effective_vars, known_vars_markdown, redact, var)

__all__ = [
    "BUILTIN_PROTECTED_PROCESSES", "Group", "Host", "Inventory", "InventoryError", "KNOWN_VARS",
    "SECRET_VARS", "VarSpec", "effective_vars", "known_vars_markdown", "load_inventory", "redact",
    "select_hosts", "split_patterns", "var",
]
