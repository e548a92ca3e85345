"""JSON-lines output of the payload (protocol version 1, docs/protocol.md), and the values of the
command flags both sides spell.

Every line written to stdout is one JSON object with ``"proto": 1`` and ``"type"``
(``log``, ``progress``, ``result`` or ``error``). Exactly one ``result`` or ``error``
line ends a command.

The names ``--engine``, ``tune --space``, ``tune --provider`` and ``bench --tool`` accept are
orch's own (not an engine's rules, which live in :mod:`remote.engines`), part of the command line the
controller writes and the payload parses: they are declared here, the one module of the payload
besides the engines' facade (``remote.engines``) that the controller may import. The controller's
inventory variables (``orch_engine``, ``orch_tune_space``, ``orch_tune_provider``), its task
arguments and the payload's argparse choices all check against these tuples.
"""

from __future__ import annotations

import json
import re
import sys
import threading
from typing import Any

from . import PROTO

_lock = threading.Lock()

#: ``tune --space``: ``smoke`` (3 configs, for CPU test beds), ``fast`` (a seeded screen refined by
#: coordinate descent, remote/tuning/tuner/search.py), ``full`` (SGLang's 1920-config CUDA space,
#: SGLang ``benchmark/kernels/fused_moe_triton/common_utils.py`` ``get_configs_compute_bound``).
SEARCH_SPACES: tuple[str, ...] = ("smoke", "fast", "full")
DEFAULT_SEARCH_SPACE = "fast"

#: The inference engines orch tunes for (``orch_engine``, the payload's ``--engine``): the keys of
#: the engine registry ``ENGINES`` in ``remote/engines/__init__.py``, each engine's own folder
#: under ``remote/engines/``. Each engine's name is also the ``tune --provider`` that times its
#: own kernel and the ``bench --tool`` that runs its own benchmark client.
ENGINE_NAMES: tuple[str, ...] = ("sglang", "vllm")
#: The engine a payload command assumes when the controller names none (the one engine orch knew
#: before it recognised engines: records written then name no engine).
DEFAULT_ENGINE = ENGINE_NAMES[0]

#: ``bench --tool``: orch's own benchmark client, or an engine's own (``Engine.bench_tool``, named
#: after the engine)
BENCH_TOOLS: tuple[str, ...] = ("builtin", *ENGINE_NAMES)
#: ``tune --budget`` and the inventory's ``orch_tune_budget``: seconds of GPU timing per GPU a tune may
#: spend on all its batch sizes (remote/tuning/tuner/floor.py). Sized so that the 18-batch-size int4
#: tune of Mixtral-8x7B (E=8, N=7168, hidden 4096, top-k 2, int4_w4a16) fits in 5 minutes on one
#: H200 (docs/benchmarks.md §4.7).
DEFAULT_TUNE_BUDGET_S = 120.0

#: ``tune --provider``: whose kernel the tuner times; ``auto`` resolves to one of
#: :data:`RESOLVED_PROVIDERS` on the host (``remote.tuning.support.resolve_provider_name``).
PROVIDER_NAMES: tuple[str, ...] = ("auto", *ENGINE_NAMES, "builtin")
DEFAULT_PROVIDER = "auto"
#: What a provider name resolves to: an engine's own fused-MoE kernel or orch's builtin one.
RESOLVED_PROVIDERS: tuple[str, ...] = (*ENGINE_NAMES, "builtin")

#: the tuner's checkpoint in its output folder (``remote.tuning.tuner.checkpoint``): the payload
#: writes it, ``orch recover`` reads it over SSH to keep a stopped tune's progress
CHECKPOINT_FILE = "checkpoint.json"

#: A run id as both sides use it (``<UTC time>-<action>-<hex>``, e.g. ``20260101T000000Z-tune-abcdef``):
#: the name of the host's run record folder and the ``ORCH_TAG`` of a run's long commands.
RUN_ID_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


def is_run_id(text: Any) -> bool:
    """True when ``text`` is a run id (:data:`RUN_ID_RE`, and not ``.`` or ``..``): safe as a folder
    name and inside a ``pgrep -f`` pattern."""
    return isinstance(text, str) and bool(RUN_ID_RE.match(text)) and text not in (".", "..")


#: the suffix of a run's sub-run that holds the Triton config files a runner trial installed
#: (``<run id>.triton``): one manifest per folder changed, the sub-run's state follows its run's
TRITON_SUBRUN_SUFFIX = ".triton"
#: orch's systemd drop-in that gives a unit the engine's config-dir variable pointing at orch's own
#: config folder (an engine with no per-Triton folders: orch never writes into its package), named
#: by the controller's plan and rollback and by the payload's ``runner_change``
CONFIGS_DROPIN_NAME = "orch-moe-configs.conf"


def parent_run(run_id: str) -> str:
    """The run a sub-run belongs to (``R.triton`` -> ``R``); any other id is its own."""
    if isinstance(run_id, str) and run_id.endswith(TRITON_SUBRUN_SUFFIX) and len(run_id) > len(TRITON_SUBRUN_SUFFIX):
        return run_id[: -len(TRITON_SUBRUN_SUFFIX)]
    return run_id


#: the ``detail`` of the ``not_found`` error a command raises for a run that has no manifest (the run
#: changed nothing: an install writes its manifest before its first change); the controller reads this,
#: never the message (remote.host.fs.load_manifest)
NO_MANIFEST = {"missing": "manifest"}


class PayloadError(Exception):
    """An error reported to the controller as an ``error`` line.

    ``kind`` is one of ``bad_input``, ``not_found``, ``locked``, ``runtime``;
    ``bad_input``/``not_found``/``locked`` exit with status 2, ``runtime`` with 1.
    """

    def __init__(self, kind: str, msg: str, detail: Any = None):
        super().__init__(msg)
        self.kind = kind
        self.msg = msg
        self.detail = detail


class BadInput(PayloadError, ValueError):
    """A ``bad_input`` :class:`PayloadError` that is also a ``ValueError``: what a pure rule (e.g.
    :func:`remote.engines.sglang.naming.sglang_device_name`) raises for a value it rejects. A command that
    lets one through ends in a ``bad_input`` line naming the value (never ``runtime``), the
    controller shows it as bad input, and callers that catch ``ValueError`` keep working."""

    def __init__(self, msg: str, detail: Any = None):
        super().__init__("bad_input", msg, detail)


def internal_error(reason: str):
    """Class decorator: declare an exception class that derives from neither root
    (:class:`PayloadError` here, ``orchestrator.errors.OrchError`` in the controller, which
    re-exports this) because it never ends a command: it is caught inside and turned into a
    result or an error of the root. ``reason`` (a sentence) says where; it is kept as
    ``cls.internal_reason``. ``tests/unit/cli/test_errors.py`` finds every exception class of
    ``remote/`` and ``orchestrator/`` and requires the root or this declaration."""
    def mark(cls):
        cls.internal_reason = reason
        return cls
    return mark


def emit(obj_type: str, **fields: Any) -> None:
    """Write one protocol line to stdout and flush it (thread-safe)."""
    line = {"proto": PROTO, "type": obj_type}
    line.update(fields)
    text = json.dumps(line, sort_keys=True, default=str)
    with _lock:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


def log(msg: str, level: str = "info") -> None:
    """Emit a ``log`` line."""
    emit("log", level=level, msg=msg)


def progress(done: int, total: int, stage: str, **extra: Any) -> None:
    """Emit a ``progress`` line: ``done``/``total`` units of work in ``stage``."""
    emit("progress", done=done, total=total, stage=stage, **extra)


def result(data: Any) -> None:
    """Emit the final ``result`` line."""
    emit("result", data=data)


def error(err: PayloadError) -> None:
    """Emit the final ``error`` line."""
    emit("error", kind=err.kind, msg=err.msg, detail=err.detail)


def exit_code(err: PayloadError) -> int:
    """Exit status for an error kind (docs/protocol.md)."""
    return 1 if err.kind == "runtime" else 2
