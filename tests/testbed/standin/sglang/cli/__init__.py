"""Stand-in for ``sglang.cli`` (orch test bed): the ``sglang`` console script's commands."""
