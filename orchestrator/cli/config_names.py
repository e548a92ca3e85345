"""``orch config-names``: the exact up and down config file names the engine looks for (``--engine``,
default SGLang), computed by the same code the payload runs on the hosts (the payload's stdlib-only
engine rules), from the same model flags (:func:`remote.engines.add_model_flags`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from remote.engines import add_model_flags, engine_named, shape_from_args

from ..errors import UsageError
from .common import EXIT_OK


def add_parser(sub) -> None:
    c = sub.add_parser("config-names", help="print the exact up and down config file names the engine looks for")
    add_model_flags(c, "config-names")
    c.add_argument("--probe", type=Path, metavar="PROBE_JSON",
                   help="instead of --device-name: the name a host's probe reported (a run record's "
                        "hosts/<host>/probe.json)")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_config_names)


def probe_device_name(path: Path) -> str:
    """The device name a host's probe reported (``device_name`` of ``python -m remote probe``'s
    result, the engine's form, as a run record keeps it in ``hosts/<host>/probe.json``).

    Raises :class:`UsageError` naming ``--probe`` when the file cannot be read, is not a probe's
    JSON, or the host saw no GPU (``device_name`` null). GPUs of different names on the host
    (``mixed_gpus``) are said on stderr: the name is GPU 0's.
    """
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise UsageError(f"--probe {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise UsageError(f"--probe {path}: not JSON ({exc})") from None
    if not isinstance(data, dict) or "device_name" not in data:
        raise UsageError(f"--probe {path}: not a host's probe.json (no 'device_name' field)")
    if not isinstance(data["device_name"], str):
        raise UsageError(f"--probe {path}: the host's probe saw no GPU (device_name is "
                         f"{data['device_name']!r}); give --device-name")
    if data.get("mixed_gpus"):
        print(f"orch config-names: warning: the host of {path} has GPUs of different names; using GPU 0's "
              f"{data['device_name']!r}", file=sys.stderr)
    return data["device_name"]


def device_name(args) -> str:
    """The engine's form of ``--device-name`` (``--engine``'s ``Engine.device_name``; or of the
    ``--probe`` file's name; exactly one of them is given, else a :class:`UsageError`). A name the
    engine's rule refuses is a :class:`UsageError` naming ``--device-name``; one not in torch's form
    (``H200`` for ``NVIDIA H200``) is printed anyway, with a warning on stderr naming the likely form
    (``Engine.device_name_hint``): it names a file the engine does not look for on that GPU, unless
    the GPU's vendor is one orch does not know (SGLang's
    :data:`remote.engines.sglang.naming.TORCH_NAME_VENDORS`), so it is flagged rather than refused."""
    from remote.protocol import PayloadError

    engine = engine_named(getattr(args, "engine", None))
    if (args.probe is None) == (args.device_name is None):
        raise UsageError("give the GPU's name with --device-name or a host's probe.json with --probe (one of them)")
    name = probe_device_name(args.probe) if args.probe is not None else args.device_name
    try:
        dev = engine.device_name(name)
    except PayloadError as exc:
        raise UsageError(f"--device-name: {exc.msg}") from None
    hint = engine.device_name_hint(name)
    if hint is not None:
        print(f"orch config-names: warning: --device-name {name!r} is not in torch's form "
              f"(torch.cuda.get_device_name() starts with the vendor, e.g. {hint!r}): {engine.display_name} on such "
              f"a GPU looks for device_name={engine.device_name(hint)}, not device_name={dev}; use --device-name "
              f"{hint!r}, or --probe with the host's probe.json", file=sys.stderr)
    return dev


def cmd_config_names(args) -> int:
    """Print the up and down file names (or ``--json`` with the model's MoE shape). A model config
    that cannot be read or is not an MoE model is a :class:`UsageError` naming why."""
    from remote.protocol import PayloadError

    dev = device_name(args)
    try:
        shape, _path = shape_from_args(args)
        names = shape.file_names(dev)
    except PayloadError as exc:
        raise UsageError(exc.msg) from None
    if args.json:
        print(json.dumps({"model": shape.to_dict(), "file_names": names}, indent=2))
    else:
        print(names["up"])
        print(names["down"])
    return EXIT_OK
