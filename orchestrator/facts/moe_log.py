"""Parse SGLang's MoE-config lookup lines out of a unit's log.

The exact lines are SGLang 0.5.23's (``fused_moe_triton_config.py``, see
``shared/facts/sglang-moe-configs.md``). Paths contain spaces and brackets
(``block_shape=[128, 128]``), so a path is taken as everything up to the fixed text
that follows it, never with ``\\S+``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_USING = re.compile(r"Using MoE kernel config from (?P<path>.+?\.json)\.\s*$")
_FALLBACK = re.compile(r"Config file not found at (?P<path>.+?\.json)\. Fallback to triton version "
                       r"(?P<version>\S+) and use MoE kernel config from (?P<path2>.+?\.json)\. "
                       r"Performance might be sub-optimal!")
_DEFAULT = re.compile(r"Using default MoE kernel config\. Performance might be sub-optimal! "
                      r"Config file not found at (?P<path>.+?\.json)(?:, you can create|\s*$)")
_DOWN_MISSING = re.compile(r"Down MoE config file not found at (?P<path>.+?\.json); reusing the tuned "
                           r"up-projection config without TMA\. Performance might be sub-optimal\.")
_DOWN_OLD = re.compile(r"Using MoE kernel config with down_moe=False\. Performance might be sub-optimal!")
READY_LINE = "The server is fired up and ready to roll!"


@dataclass
class MoeLogReport:
    """What a server start logged about MoE configs.

    ``loaded``: paths from ``Using MoE kernel config from``; ``fallback``: (wanted, used,
    triton version); ``default``: wanted paths for which the default config was used;
    ``down_missing``: wanted down paths; ``suboptimal``: every line with
    ``Performance might be sub-optimal``; ``ready``: the ready line was seen.
    """

    loaded: list[str] = field(default_factory=list)
    fallback: list[tuple[str, str, str]] = field(default_factory=list)
    default: list[str] = field(default_factory=list)
    down_missing: list[str] = field(default_factory=list)
    suboptimal: list[str] = field(default_factory=list)
    ready: bool = False

    @property
    def any_lookup(self) -> bool:
        """True when the log shows any Triton MoE config lookup at all."""
        return bool(self.loaded or self.fallback or self.default or self.down_missing)


def parse_moe_log(text: str) -> MoeLogReport:
    """Scan log ``text`` (one server start) and return a :class:`MoeLogReport`."""
    rep = MoeLogReport()
    for line in text.splitlines():
        if READY_LINE in line:
            rep.ready = True
        if "sub-optimal" in line:
            rep.suboptimal.append(line.strip())
        m = _USING.search(line)
        if m:
            rep.loaded.append(m.group("path"))
            continue
        m = _FALLBACK.search(line)
        if m:
            rep.fallback.append((m.group("path"), m.group("path2"), m.group("version")))
            continue
        m = _DEFAULT.search(line)
        if m:
            rep.default.append(m.group("path"))
            continue
        m = _DOWN_MISSING.search(line)
        if m:
            rep.down_missing.append(m.group("path"))
            continue
        if _DOWN_OLD.search(line):
            rep.down_missing.append("")
    return rep


def verify_loaded(rep: MoeLogReport, expected_paths: list[str]) -> list[str]:
    """Problems that make a start count as NOT running the installed configs.

    Each expected path must appear in a ``Using MoE kernel config from`` line, and no
    line may say ``sub-optimal`` for one of them (fallback, default, or down missing).
    Returns a list of human-readable problems (empty when verified).
    """
    problems = []
    for p in expected_paths:
        if p not in rep.loaded:
            problems.append(f"log does not show 'Using MoE kernel config from {p}.'")
    for wanted, used, ver in rep.fallback:
        if wanted in expected_paths:
            problems.append(f"server fell back to Triton {ver} config {used} (sub-optimal)")
    for wanted in rep.default:
        if wanted in expected_paths:
            problems.append(f"server used the default MoE config; not found: {wanted}")
    for wanted in rep.down_missing:
        if not wanted or wanted in expected_paths:
            problems.append(f"server did not find the down config {wanted}".rstrip())
    return problems
