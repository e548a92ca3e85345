"""Stand-in for ``sglang.cli.main`` (orch test bed): ``sglang serve ARGS`` and ``sglang version``.

Follows SGLang 0.5.23 ``sglang/cli/main.py`` and ``sglang/cli/serve.py``: the top-level parser
takes the subcommand and leaves the rest to it; ``serve`` removes ``--model-type X`` (``llm`` and
``auto`` only: the stand-in serves language models), turns a first word that is not an option
into ``--model-path WORD``, needs a model (``--model-path``/``--model``), and runs the server
with the rest as ``python -m sglang.launch_server`` would (:func:`sglang._standin.server.main`).
The console script (``bin/sglang`` of the host's tree) is written by the test bed as pip writes
one: a shebang naming the Python, then ``from sglang.cli.main import main``.
"""

import argparse
import sys


def _serve(extra):
    backend, rest, i = "auto", [], 0
    while i < len(extra):
        if extra[i] == "--model-type":
            if i + 1 >= len(extra):
                raise ValueError("Error: --model-type requires a value.")
            backend, i = extra[i + 1], i + 2
            continue
        if extra[i].startswith("--model-type="):
            backend, i = extra[i].split("=", 1)[1], i + 1
            continue
        rest.append(extra[i])
        i += 1
    if backend not in ("auto", "llm"):
        raise ValueError(f"Unknown serve backend {backend!r} (the stand-in serves llm only)")
    if rest and not rest[0].startswith("-"):
        rest = ["--model-path", rest[0], *rest[1:]]
    if not any(a in ("--model-path", "--model") or a.startswith(("--model-path=", "--model=")) for a in rest):
        raise Exception("Error: --model-path is required. Please provide the path to the model.")
    from sglang._standin.server import main as server_main

    return server_main(rest)


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="subcommand", required=True)
    sub.add_parser("serve", add_help=False)
    sub.add_parser("version")
    args, extra = parser.parse_known_args()
    if args.subcommand == "serve":
        return _serve(extra)
    from sglang.version import __version__

    print(f"sglang version: {__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
