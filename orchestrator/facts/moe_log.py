"""Parse SGLang's MoE-config lookup lines out of a unit's log: one model for every release.

Each lookup line becomes a :class:`MoeLogLine` that says which file (``up`` or ``down``,
from the ``_down`` suffix of the path) and what SGLang did:

``loaded``
    read the file in the installed Triton's folder.
``fallback``
    read the same name from another ``configs/triton_*`` folder (``triton_version``).
``reuse_up``
    (down file only) found no down file anywhere: the down GEMM runs the up GEMM's
    config table, whatever that is (tuned, fallen back, or the default heuristic). Every
    release that reads ``_down`` files does this (``fused_moe.py``: ``down_config or config``);
    only the wording differs.
``default``
    (up file) found the file nowhere: the default heuristic; also the deterministic-
    inference line, which names no file (``role`` None).

Wordings, from the real code of each release (``docs/sglang-releases.md``; the oracle tests
``tests/unit/remote/sglang/test_oracle.py`` hold them against every covered release):

* ``found`` (all): ``Using MoE kernel config from {path}.``
* ``fallback`` (all): ``Config file not found at {path}. Fallback to triton version {v} and use
  MoE kernel config from {path2}. Performance might be sub-optimal!``
* ``default`` (all): ``Using default MoE kernel config. Performance might be sub-optimal! Config
  file not found at {path}, you can create them with https://...`` For a ``_down`` path
  (0.5.5, and 0.5.16+ when the up file is missing too) this is ``reuse_up``.
* ``down_moe=False`` (0.5.6 ... 0.5.15): ``Using MoE kernel config with down_moe=False.
  Performance might be sub-optimal! Config file not found at {path}, you can create them with
  https://...`` (``reuse_up``).
* ``down-reuse`` (0.5.16+): ``Down MoE config file not found at {path}; reusing the tuned
  up-projection config without TMA. Performance might be sub-optimal.`` (``reuse_up``).
* ``deterministic`` (0.5.5+): ``Deterministic inference is enabled, using default MoE kernel
  config.`` (``default``, no file).

Paths contain spaces and brackets (``block_shape=[128, 128]``), so a path is taken as
everything up to the fixed text that follows it, never with ``\\S+``. A line may carry any
prefix (timestamps, ``TP0``); the text is searched, not anchored at the start.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_HINT = r"(?:, you can create them with .*|\s*)$"
_WORDINGS = (
    ("found", re.compile(r"Using MoE kernel config from (?P<path>.+?\.json)\.\s*$")),
    ("fallback", re.compile(r"Config file not found at (?P<path>.+?\.json)\. Fallback to triton version "
                            r"(?P<version>\S+) and use MoE kernel config from (?P<path2>.+?\.json)\. "
                            r"Performance might be sub-optimal!")),
    ("default", re.compile(r"Using default MoE kernel config\. Performance might be sub-optimal! "
                           r"Config file not found at (?P<path>.+?\.json)" + _HINT)),
    ("down_moe=False", re.compile(r"Using MoE kernel config with down_moe=False\. Performance might be "
                                  r"sub-optimal! Config file not found at (?P<path>.+?\.json)" + _HINT)),
    ("down-reuse", re.compile(r"Down MoE config file not found at (?P<path>.+?\.json); reusing the tuned "
                              r"up-projection config without TMA\. Performance might be sub-optimal\.")),
    ("deterministic", re.compile(r"Deterministic inference is enabled, using default MoE kernel config\.")),
)
READY_LINE = "The server is fired up and ready to roll!"
ACTIONS = ("loaded", "fallback", "reuse_up", "default")


def role_of(path: str) -> str:
    """``down`` for a ``..._down.json`` path (SGLang's down selector, last before ``.json``), else ``up``."""
    return "down" if path.endswith("_down.json") else "up"


@dataclass(frozen=True)
class MoeLogLine:
    """One lookup line of SGLang's MoE-config loader.

    ``role``: ``up`` | ``down`` (None for the deterministic line, which names no file);
    ``action``: one of :data:`ACTIONS` (module docstring); ``wanted``: the path SGLang looked
    for first (installed Triton's folder; None for the deterministic line); ``used``: the file
    it read (``loaded``/``fallback``), else None; ``triton_version``: the folder's version of a
    ``fallback`` (str, e.g. ``3.5.1``); ``wording``: which release wording matched
    (``found``, ``fallback``, ``default``, ``down_moe=False``, ``down-reuse``, ``deterministic``);
    ``text``: the line, stripped.
    """

    role: str | None
    action: str
    wanted: str | None
    used: str | None
    triton_version: str | None
    wording: str
    text: str


def parse_line(line: str) -> MoeLogLine | None:
    """The :class:`MoeLogLine` of one log line, or None when it is not a lookup line."""
    for wording, rx in _WORDINGS:
        m = rx.search(line)
        if not m:
            continue
        text = line.strip()
        if wording == "deterministic":
            return MoeLogLine(None, "default", None, None, None, wording, text)
        path = m.group("path")
        role = role_of(path)
        if wording == "found":
            return MoeLogLine(role, "loaded", path, path, None, wording, text)
        if wording == "fallback":
            return MoeLogLine(role, "fallback", path, m.group("path2"), m.group("version"), wording, text)
        if role == "down" or wording != "default":
            # every not-found wording for a down file: the down GEMM runs the up config table
            return MoeLogLine("down", "reuse_up", path, None, None, wording, text)
        return MoeLogLine("up", "default", path, None, None, wording, text)
    return None


@dataclass
class MoeLogReport:
    """What a server start logged about MoE configs.

    ``lines``: every lookup line (:class:`MoeLogLine`, in log order); ``suboptimal``: every
    line with ``sub-optimal`` in it; ``ready``: the ready line was seen. The list views
    ``loaded``, ``fallback``, ``default``, ``down_missing`` are derived from ``lines``.
    """

    lines: list[MoeLogLine] = field(default_factory=list)
    suboptimal: list[str] = field(default_factory=list)
    ready: bool = False

    @property
    def loaded(self) -> list[str]:
        """Paths read from the installed Triton's folder (``Using MoE kernel config from``)."""
        return [ln.used for ln in self.lines if ln.action == "loaded"]

    @property
    def fallback(self) -> list[tuple[str, str, str]]:
        """``(wanted, used, triton version)`` of each fallback to another Triton's folder."""
        return [(ln.wanted, ln.used, ln.triton_version) for ln in self.lines if ln.action == "fallback"]

    @property
    def default(self) -> list[str]:
        """Wanted up paths for which the default heuristic ran (the deterministic line names none)."""
        return [ln.wanted for ln in self.lines if ln.action == "default" and ln.wanted]

    @property
    def down_missing(self) -> list[str]:
        """Wanted down paths found nowhere (the down GEMM reused the up config table)."""
        return [ln.wanted for ln in self.lines if ln.action == "reuse_up"]

    @property
    def deterministic(self) -> bool:
        """True when the start ran with deterministic inference (default configs, no lookup)."""
        return any(ln.wording == "deterministic" for ln in self.lines)

    @property
    def any_lookup(self) -> bool:
        """True when the log shows any Triton MoE config lookup at all."""
        return bool(self.lines)

    @property
    def overall(self) -> str:
        """What the start ran, in one word.

        ``none``: no lookup line; ``loaded``: every lookup read its file from the installed
        Triton's folder; ``default``: no lookup read any file (the up GEMM ran the default
        heuristic, a missing down file reused it); ``fallback``: anything else (a fallback
        folder, or a tuned up file with a missing down file).
        """
        if not self.lines:
            return "none"
        if all(ln.action == "loaded" for ln in self.lines):
            return "loaded"
        if not any(ln.action in ("loaded", "fallback") for ln in self.lines):
            return "default"
        return "fallback"


def parse_moe_log(text: str) -> MoeLogReport:
    """Scan log ``text`` (one server start) and return a :class:`MoeLogReport`."""
    rep = MoeLogReport()
    for line in text.splitlines():
        if READY_LINE in line:
            rep.ready = True
        if "sub-optimal" in line:
            rep.suboptimal.append(line.strip())
        parsed = parse_line(line)
        if parsed is not None:
            rep.lines.append(parsed)
    return rep


def verify_loaded(rep: MoeLogReport, expected_paths: list[str]) -> list[str]:
    """Problems that make a start count as NOT running the installed configs.

    Each expected path must appear in a ``Using MoE kernel config from`` line, and no
    lookup line may report a fallback, the default or a missing down file for one of them
    (nor may the start run deterministic inference, which reads no file).
    Returns a list of human-readable problems (empty when verified).
    """
    problems = []
    for p in expected_paths:
        if p not in rep.loaded:
            problems.append(f"log does not show 'Using MoE kernel config from {p}.'")
    if rep.deterministic and expected_paths:
        problems.append("deterministic inference is enabled: SGLang uses the default MoE config")
    for ln in rep.lines:
        if ln.wanted not in expected_paths:
            continue
        if ln.action == "fallback":
            problems.append(f"server fell back to Triton {ln.triton_version} config {ln.used} (sub-optimal)")
        elif ln.action == "default":
            problems.append(f"server used the default MoE config; not found: {ln.wanted}")
        elif ln.action == "reuse_up":
            problems.append(f"server did not find the down config {ln.wanted}")
    return problems
