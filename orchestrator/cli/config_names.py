"""``orch config-names``: the exact up and down config file names SGLang looks for, computed by the
same code the payload runs on the hosts (the payload's stdlib-only SGLang rules)."""

from __future__ import annotations

import json

from ..errors import UsageError
from .common import EXIT_OK


def add_parser(sub) -> None:
    c = sub.add_parser("config-names", help="print the exact up and down config file names SGLang looks for")
    c.add_argument("--model-config", required=True, help="config.json, its folder, or an offline HF repo id")
    c.add_argument("--tp", type=int, default=1)
    c.add_argument("--ep", type=int, default=1)
    c.add_argument("--device-name", required=True, help="torch.cuda.get_device_name(), e.g. 'NVIDIA H200'")
    c.add_argument("--dtype")
    c.add_argument("--quantization")
    c.add_argument("--disable-shared-experts-fusion", action="store_true")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_config_names)


def cmd_config_names(args) -> int:
    """Print the up and down file names (or ``--json`` with the model's MoE shape). A model config
    that cannot be read or is not an MoE model is a :class:`UsageError` naming why."""
    from remote.sglang.model import load_model_config, moe_shape
    from remote.sglang.naming import sglang_device_name
    from remote.protocol import PayloadError

    try:
        cfg = load_model_config(args.model_config)
        shape = moe_shape(cfg, tp=args.tp, ep=args.ep, quantization=args.quantization, dtype=args.dtype,
                          disable_shared_experts_fusion=args.disable_shared_experts_fusion)
        names = shape.file_names(sglang_device_name(args.device_name))
    except PayloadError as exc:
        raise UsageError(exc.msg) from None
    if args.json:
        print(json.dumps({"model": shape.to_dict(), "file_names": names}, indent=2))
    else:
        print(names["up"])
        print(names["down"])
    return EXIT_OK
