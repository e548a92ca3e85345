"""The one exception the inventory package raises."""

from __future__ import annotations

from ..errors import OrchError


class InventoryError(OrchError):
    """A bad inventory, variable or ``--limit`` pattern.

    ``str(err)`` is one line that names the file and line when there is one, e.g.
    ``inventories/x.yaml:12: host 'gpu-a': ansible_port must be an integer 1-65535, got 'abc'``.
    Attributes: ``path`` (str | None), ``line`` (1-based int | None), ``msg`` (the text after
    the location).
    """

    def __init__(self, msg: str, path: str | None = None, line: int | None = None,
                 column: int | None = None) -> None:
        self.msg = " ".join(str(msg).split())  # always one line
        self.path = path
        self.line = line
        self.column = column
        loc = ""
        if path is not None:
            loc = path
            if line is not None:
                loc += f":{line}"
                if column is not None:
                    loc += f":{column}"
            loc += ": "
        super().__init__(loc + self.msg)
