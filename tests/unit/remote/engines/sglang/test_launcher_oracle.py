"""The real SGLang is the judge of how orch reads ``sglang serve ARGS`` (``remote.engines.sglang.launcher``).

SGLang 0.5.23's own ``sglang/cli/main.py`` (the console script's ``main``), ``sglang/cli/serve.py``
and ``sglang/cli/serve_backends.py`` run here from the release's source tree; what they import
from the rest of SGLang stands in: ``prepare_server_args`` records the argv it receives (the
arguments SGLang's server parser gets), ``run_server``, ``load_plugins`` and
``kill_process_tree`` do nothing, and the diffusion detection says "not a diffusion model"
(``get_is_diffusion_model``: the test's models are language models). ``try_get_model_path`` and
``get_model_path`` are the release's own functions, cut out of ``sglang/cli/utils.py`` (whose
imports need the hub client). For each command line, orch's
:func:`remote.engines.sglang.launcher.serve_server_argv` must give exactly the argv SGLang hands its
server parser, and refuse what SGLang does not start as a language-model server.
"""

from __future__ import annotations

import ast
import importlib.util
import shlex
import sys
import types

import pytest

from remote.engines.sglang.launcher import LaunchError, resolve, serve_server_argv
from tests.sglang_releases import source_tree

RELEASE = "0.5.23"


class _Ran(Exception):
    """prepare_server_args was called (it carries the argv)."""


def _module(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    if "." not in name or name.count(".") < 3:
        mod.__path__ = []  # a package, so submodules resolve
    return mod


def _functions(path, names: set[str]) -> dict:
    """The functions ``names`` of the file ``path``, executed alone."""
    tree = ast.parse(path.read_text())
    body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    ns: dict = {}
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), ns)  # noqa: S102 (SGLang's own code)
    return ns


@pytest.fixture(scope="module")
def sglang_main():
    tree = source_tree(RELEASE) / "sglang"
    saved = {k: v for k, v in sys.modules.items() if k == "sglang" or k.startswith("sglang.")}
    for k in saved:
        del sys.modules[k]
    received: list[list[str]] = []

    def prepare_server_args(argv):
        received.append(list(argv))
        raise _Ran(list(argv))

    utils = _functions(tree / "cli" / "utils.py", {"try_get_model_path", "get_model_path"})
    mods = [
        _module("sglang"), _module("sglang.version", __version__=RELEASE), _module("sglang.cli"),
        _module("sglang.cli.utils", get_git_commit_hash=lambda: "0" * 7, get_is_diffusion_model=lambda p: False,
                get_pipeline_class_name=lambda argv: None, is_registered_native_pipeline=lambda n: False,
                try_get_model_path=utils["try_get_model_path"], get_model_path=utils["get_model_path"]),
        _module("sglang.srt"), _module("sglang.srt.utils", kill_process_tree=lambda *a, **k: None),
        _module("sglang.srt.utils.common", suppress_noisy_warnings=lambda: None),
        _module("sglang.srt.plugins", load_plugins=lambda: None),
        _module("sglang.srt.server_args", prepare_server_args=prepare_server_args),
        _module("sglang.launch_server", run_server=lambda server_args: None),
    ]
    for m in mods:
        sys.modules[m.__name__] = m
    for name in ("serve_backends", "main", "serve"):
        spec = importlib.util.spec_from_file_location(f"sglang.cli.{name}", tree / "cli" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
    main = sys.modules["sglang.cli.main"].main
    yield main, received
    for k in [k for k in sys.modules if k == "sglang" or k.startswith("sglang.")]:
        del sys.modules[k]
    sys.modules.update(saved)


def _sglang_argv(main, received, words: list[str]) -> list[str] | BaseException:
    """What SGLang's ``sglang`` console script hands ``prepare_server_args`` for ``words``, or
    the exception it ends with."""
    received.clear()
    old = sys.argv
    sys.argv = ["sglang", *words]
    try:
        main()
    except _Ran as ran:
        return ran.args[0]
    except (Exception, SystemExit) as exc:  # noqa: BLE001 (what SGLang raises is the answer)
        return exc
    finally:
        sys.argv = old
    return RuntimeError("prepare_server_args was not called")


CASES = [
    "serve /models/qwen --tp 2",
    "serve --model-path /models/qwen --tp 2 --port 30001",
    "serve --model /models/qwen --tp-size 2",
    "serve --model-type llm /models/qwen --tp 2",
    "serve /models/qwen --model-type=llm --ep 2",
    "serve --model-type auto --model-path=/models/qwen",
    "serve /models/qwen --config /etc/sglang/qwen.yaml",
    "serve /models/qwen --served-model-name x --host 0.0.0.0",
]


@pytest.mark.parametrize("line", CASES)
def test_serve_arguments_are_what_sglang_hands_its_server_parser(sglang_main, line):
    main, received = sglang_main
    words = shlex.split(line)
    got = _sglang_argv(main, received, words)
    assert isinstance(got, list), f"SGLang did not start the LLM server for {line!r}: {got!r}"
    assert serve_server_argv(words[1:]) == got
    assert resolve(["/opt/venv/bin/sglang", *words]).server_argv == got


@pytest.mark.parametrize("line", ["serve /models/x --model-type", "serve /models/x --model-type=",
                                  "serve --model-type diffusion /models/x", "serve --tp 2 /models/x",
                                  "serve --model-p /models/x", "serve --port 1"])
def test_what_sglang_does_not_start_as_a_language_model_server_is_refused(sglang_main, line):
    main, received = sglang_main
    words = shlex.split(line)
    got = _sglang_argv(main, received, words)
    assert not isinstance(got, list) and received == [], f"SGLang ran its LLM server parser for {line!r}"
    with pytest.raises(LaunchError):
        serve_server_argv(words[1:])


@pytest.mark.parametrize("line", ["version", "generate --model-path /models/x"])
def test_other_subcommands_are_no_server(sglang_main, line):
    main, received = sglang_main
    got = _sglang_argv(main, received, shlex.split(line))
    assert received == [], got
    with pytest.raises(LaunchError, match="does not start a server"):
        resolve(["/opt/venv/bin/sglang", *shlex.split(line)])
