"""The records that cross the :class:`~remote.engines.interface.Engine` interface (standard library only).

Each engine fills them by its own rules (its ``moe_log``, ``runner`` and ``autotune`` modules);
the controller reads only these fields and predicates, never an engine's name for a runner:

- :class:`MoeRunner`: which MoE runner a server runs, whether it reads the Triton config files
  (``reads_triton_configs``) and whether it autotunes at start (``autotunes``);
- :class:`MoeLogLine`, :class:`RunnerLine`, :class:`MoeLogReport`: what one server start logged
  about its MoE config lookups (loaded, fallback, default, a missing down file) and its runner;
- :class:`AutotuneLog`, :class:`AutotuneState`: a start-up autotune whose cache is host state;
- :class:`RootHazards`: what in a server's configs root makes it crash or read another folder;
- :class:`HttpRequest`, :class:`Generation`: a request to the server and a generation's answer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# ----------------------------------------------------------------------------- the MoE runner


@dataclass(frozen=True)
class MoeRunner:
    """Which MoE runner a server uses and whether it reads the Triton config files.

    ``runner``: the engine's name of the runner (None when unknown); ``reads_triton_configs``:
    True (the runner reads the fused-MoE Triton config files), False, or None (unknown:
    ``reason`` says why); ``reason``: the engine's reason, naming the release file and function
    the answer follows (or the log line); ``source``: ``flag`` (the unit names the runner and
    nothing changes it), ``derived`` (from the unit, the model and the GPU), ``log`` (the last
    start's log); ``disagreement``: the log and the derived answer differ (both said), else None;
    ``autotunes``: the runner autotunes its kernels at start-up (a cache that is host state:
    :class:`AutotuneState`).
    """

    runner: str | None
    reads_triton_configs: bool | None
    reason: str
    source: str = "derived"
    disagreement: str | None = None
    autotunes: bool = False

    @property
    def known(self) -> bool:
        """True when it is known whether the files are read."""
        return self.reads_triton_configs is not None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the fields."""
        return asdict(self)


# ----------------------------------------------------------------------------- the start-up log


@dataclass(frozen=True)
class RunnerLine:
    """A line that says which MoE runner backend the server's argument resolution set.

    ``runner``: the backend; ``wording``: which of the engine's wordings matched; ``text``: the
    line, stripped.
    """

    runner: str
    wording: str
    text: str


#: what a lookup line says the loader did: read the file in the installed Triton's folder,
#: fell back to another Triton's folder, ran the down GEMM on the up GEMM's table (no down file
#: anywhere), or ran the default config (no up file anywhere)
ACTIONS = ("loaded", "fallback", "reuse_up", "default")


@dataclass(frozen=True)
class MoeLogLine:
    """One lookup line of the engine's MoE-config loader.

    ``role``: ``up`` | ``down`` (None for a line that names no file); ``action``: one of
    :data:`ACTIONS`; ``wanted``: the path the loader looked for first (the installed Triton's
    folder; None for a line that names no file); ``used``: the file it read (``loaded``/
    ``fallback``), else None; ``triton_version``: the folder's version of a ``fallback`` (str, e.g.
    ``3.5.1``); ``wording``: which release wording matched (``deterministic``: a start that reads no
    file at all); ``text``: the line, stripped.
    """

    role: str | None
    action: str
    wanted: str | None
    used: str | None
    triton_version: str | None
    wording: str
    text: str


@dataclass
class MoeLogReport:
    """What a server start logged about MoE configs.

    ``lines``: every lookup line (:class:`MoeLogLine`, in log order); ``suboptimal``: every line
    the engine marks as sub-optimal; ``ready``: the ready line was seen; ``runner_lines``: every
    runner choice (:class:`RunnerLine`); ``start_runner``: the MoE runner backend of the last
    start line (as argument resolution left it: ``auto`` is decided later, by the layer's
    quantization method), None when no start line shows one; ``autotune``: what the start logged
    of its start-up autotune (:class:`AutotuneLog`, None: nothing). The list views ``loaded``,
    ``fallback``, ``default``, ``down_missing`` are derived from ``lines``.
    """

    lines: list[MoeLogLine] = field(default_factory=list)
    suboptimal: list[str] = field(default_factory=list)
    ready: bool = False
    runner_lines: list[RunnerLine] = field(default_factory=list)
    start_runner: str | None = None
    autotune: "AutotuneLog | None" = None

    @property
    def loaded(self) -> list[str]:
        """Paths read from the installed Triton's folder."""
        return [ln.used for ln in self.lines if ln.action == "loaded"]

    @property
    def fallback(self) -> list[tuple[str, str, str]]:
        """``(wanted, used, triton version)`` of each fallback to another Triton's folder."""
        return [(ln.wanted, ln.used, ln.triton_version) for ln in self.lines if ln.action == "fallback"]

    @property
    def default(self) -> list[str]:
        """Wanted up paths for which the default heuristic ran (a line that names no file is left out)."""
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
    def chosen_runner(self) -> str | None:
        """The runner backend resolution chose: the start line's (:attr:`start_runner`), else the
        last runner line's; None when the log shows neither."""
        if self.start_runner:
            return self.start_runner
        return self.runner_lines[-1].runner if self.runner_lines else None

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


# ----------------------------------------------------------------------------- start-up autotune


@dataclass(frozen=True)
class AutotuneLog:
    """What a start's log says of the start-up autotune: ``path`` (the cache file it used or
    wrote), ``reuse`` (False for a start that does not reuse the cache), ``completed`` (the
    autotune's end was logged), ``tuning`` (the autotuning library's own start line is the last of
    its start and end lines: it is tuning now, or it hung there)."""

    path: str | None = None
    reuse: bool | None = None
    completed: bool = False
    tuning: bool = False

    @property
    def unfinished(self) -> bool:
        """The autotune started and its end is not logged (yet)."""
        return self.tuning or (self.path is not None and not self.completed)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the fields."""
        return asdict(self)


@dataclass(frozen=True)
class AutotuneState:
    """The start-up autotune of one server, as ``orch doctor`` shows it.

    ``enabled``: it runs at start (True/False, None: unknown) and ``why``; ``reuse``: a start
    reuses the cache; ``root``: the cache root; ``flashinfer_version``: the autotuning library's
    version (the cache folder's name); ``key``: this server's cache key, None when it cannot be
    told (``key_why`` says why); ``key_source``: ``log`` (the path the last start logged) or
    ``derived``; ``path``: the folder of this server's cache; ``cache``: ``present``, ``missing``,
    ``unknown`` or ``not-reused``; ``other_versions``: folders of caches left by another version
    of the library (for this key when known, else for this GPU generation).
    """

    enabled: bool | None
    why: str
    reuse: bool
    root: str | None
    flashinfer_version: str | None
    key: str | None
    key_source: str | None
    key_why: str | None
    path: str | None
    cache: str
    other_versions: list[str]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the fields."""
        return asdict(self)


# ----------------------------------------------------------------------------- the configs root


@dataclass
class RootHazards:
    """What in a server's configs root makes a start or a lookup crash, or makes the server read
    another folder than the one orch probed (``Engine.root_hazards``; ``plan`` refuses to install
    into such a root, ``orch doctor`` names each hazard with its path).

    ``entries``: entries of the configs root the engine's lookup cannot parse, each ``{"path",
    "state", "why"}`` (``state``: ``will-crash``, a lookup the server makes lists the root and dies
    on the entry; ``not-loaded``, never read as things stand); ``config_dir``: the engine's
    config-dir variable set but empty or relative, ``{"value", "configs_root", "why", "exists",
    "state"}`` (``configs_root``: the folder the server then reads, resolved against its working
    directory; ``exists``: whether that folder is on the host, None when not checked, a container's;
    ``state``: ``will-crash`` when a lookup would die on it, else ``not-loaded``: orch's probe and the
    engine's own folder are not what the server reads), or None; ``install_refusal``: the engine's
    sentence refusing an install into the root while ``entries`` are there (None: no entry).
    """

    entries: list[dict] = field(default_factory=list)
    config_dir: dict | None = None
    install_refusal: str | None = None

    @property
    def will_crash(self) -> list[str]:
        """The reasons a start or a lookup of this server dies, one per hazard."""
        out = [f"{e['path']}: {e['why']}" for e in self.entries if e["state"] == "will-crash"]
        if self.config_dir and self.config_dir.get("state") == "will-crash":
            out.append(f"{self.config_dir['configs_root']} does not exist: {self.config_dir['why']}")
        return out

    def notes(self) -> list[str]:
        """One line per hazard, with its state and path."""
        out = [f"{e['state']}: {e['path']}: {e['why']}" for e in self.entries]
        if self.config_dir:
            out.append(f"{self.config_dir.get('state') or 'not-loaded'}: {self.config_dir['configs_root']}: "
                       f"{self.config_dir['why']}")
        return out


# ----------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class HttpRequest:
    """One request to the server: ``method``, ``path`` (``/generate``) and its JSON ``body``."""

    method: str
    path: str
    body: dict[str, Any] | None = None


@dataclass(frozen=True)
class Generation:
    """A generation's answer: ``text``, ``output_ids`` (None when the server sends none) and
    ``tokens`` (output tokens: the server's count, else ``len(output_ids)``, 0 for no answer)."""

    text: str = ""
    output_ids: list[int] | None = None
    tokens: int = 0

    def to_dict(self) -> dict[str, Any]:
        """``{"text", "output_ids"}``: the form the runner trial's output check compares."""
        return {"text": self.text, "output_ids": self.output_ids}
