"""``orch config-names``: the exact up and down config file names SGLang looks for, computed by the
same code the payload runs on the hosts (the payload's stdlib-only SGLang rules), from the same model
flags (:data:`remote.sglang.model_flags.MODEL_FLAGS`)."""

from __future__ import annotations

import json

from remote.sglang.model_flags import add_model_flags

from ..errors import UsageError
from .common import EXIT_OK


def add_parser(sub) -> None:
    c = sub.add_parser("config-names", help="print the exact up and down config file names SGLang looks for")
    add_model_flags(c, "config-names")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_config_names)


def cmd_config_names(args) -> int:
    """Print the up and down file names (or ``--json`` with the model's MoE shape). A model config
    that cannot be read or is not an MoE model is a :class:`UsageError` naming why."""
    from remote.sglang.model_flags import shape_from_args
    from remote.sglang.naming import sglang_device_name
    from remote.protocol import PayloadError

    try:
        shape, _path = shape_from_args(args)
        names = shape.file_names(sglang_device_name(args.device_name))
    except PayloadError as exc:
        raise UsageError(exc.msg) from None
    if args.json:
        print(json.dumps({"model": shape.to_dict(), "file_names": names}, indent=2))
    else:
        print(names["up"])
        print(names["down"])
    return EXIT_OK
