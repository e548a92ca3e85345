"""What ``plan`` decides before anything is stopped: the plan (``orch_plan``) and where the
server answers (``orch_endpoint``). Produced by the ``plan`` task
(:mod:`orchestrator.tasks.probe`); read by playbooks (``orch_plan.action``, ``orch_plan.paths``,
``orch_plan.install_dir``), by readiness and the benchmarks (the endpoint) and by the run
summary."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .schema import Record


@dataclass(slots=True)
class Plan(Record):
    """What a tune does on this host.

    ``action``: ``tune``, or ``skip`` for a MoE runner that reads no Triton config file
    (``reason`` says why; empty for ``tune``); ``backend``: the unit's ``--moe-runner-backend``
    (``auto`` when not given); ``runner``: which MoE runner the server uses and why
    (:meth:`remote.engines.sglang.runner.MoeRunner.to_dict`: ``runner``, ``reads_triton_configs``,
    ``reason``, ``source``, ...); ``install_dir``: the folder the files go to; ``paths``: role
    (``up``/``down``) -> the exact file written, only the roles the host's SGLang reads;
    ``existing``: role -> whether that file exists already (a replace, not a new file);
    ``names_source``: ``log`` (named as the server's last start looked them up) or ``derived``
    (from the unit and the model config); ``notes``: where the log's names were followed;
    ``install_dir_exists``: whether the folder exists (None: a folder the server's log named, not
    probed; the install creates it when missing); ``dropin``: for an engine that keeps no folder per
    Triton release and a unit that names no config folder, the drop-in that points the unit at
    orch's own folder (``install_dir``) through the engine's config-dir variable, as ``{"env",
    "folder", "name", "text"}`` (None: the unit reads ``install_dir`` as it is: nothing of the unit
    changes).
    """

    action: str
    reason: str
    backend: str
    install_dir: str
    paths: dict[str, str] = field(default_factory=dict)
    existing: dict[str, bool] = field(default_factory=dict)
    names_source: str = "derived"
    notes: list[str] = field(default_factory=list)
    install_dir_exists: bool | None = None
    runner: dict[str, Any] = field(default_factory=dict)
    dropin: dict[str, str] | None = None


@dataclass(slots=True)
class Endpoint(Record):
    """Where the server is asked (readiness, benchmarks): ``url`` (base URL, no trailing
    slash), ``via`` (``host``: asked on the host through the payload; ``controller``: from the
    controller, ``orch_server_url``), ``checked`` (it answered ``/v1/models`` 200 when plan ran)
    and ``tried`` (each address asked and what it answered)."""

    url: str
    via: str
    checked: bool = False
    tried: list[str] = field(default_factory=list)
