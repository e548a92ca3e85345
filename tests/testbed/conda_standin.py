"""Stand-in for ``conda run`` (orch test bed; conda is not installed here).

Follows conda's ``run`` command line: ``conda run (-n ENV | -p PREFIX) [--no-capture-output |
--live-stream | -s] [--cwd DIR] [-v] [--dev] [--debug-wrapper-scripts] COMMAND ...``. The
environments live beside the script (``<root>/envs/ENV``, ``base`` is ``<root>``, the script being
``<root>/bin/conda``); an absent one fails as conda does ("EnvironmentLocationNotFound"). It
activates the environment as conda's activation does for ``PATH``, ``CONDA_PREFIX``,
``CONDA_DEFAULT_ENV`` and ``CONDA_SHLVL``, then runs the command as its child (conda runs it
through a wrapper script, not by exec), passes SIGTERM/SIGINT on to it, and exits with its status;
without ``--no-capture-output`` it holds the command's output until it ends, as conda does.
For the tests it appends each command it runs to ``<root>/run.log`` (one JSON list a line).
"""

import json
import os
import signal
import subprocess
import sys


def main(argv):
    if not argv or argv[0] != "run":
        print("conda stand-in: only 'conda run' is provided", file=sys.stderr)
        return 2
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    name = prefix = cwd = None
    capture = True
    i = 1
    while i < len(argv):
        a = argv[i]
        if a in ("-n", "--name", "-p", "--prefix", "--cwd"):
            if i + 1 >= len(argv):
                print(f"conda run: error: argument {a}: expected one argument", file=sys.stderr)
                return 2
            if a in ("-n", "--name"):
                name = argv[i + 1]
            elif a in ("-p", "--prefix"):
                prefix = argv[i + 1]
            else:
                cwd = argv[i + 1]
            i += 2
        elif a in ("--no-capture-output", "--live-stream", "-s"):
            capture, i = False, i + 1
        elif a in ("-v", "--verbose", "--dev", "--debug-wrapper-scripts"):
            i += 1
        elif a.startswith("-"):
            print(f"conda run: error: unrecognized arguments: {a}", file=sys.stderr)
            return 2
        else:
            break
    cmd = argv[i:]
    if not cmd:
        print("conda run: error: the following arguments are required: executable_call", file=sys.stderr)
        return 2
    if prefix is None:
        prefix = root if name in (None, "base") else os.path.join(root, "envs", name)
    if not os.path.isdir(os.path.join(prefix, "conda-meta")):
        print(f"EnvironmentLocationNotFound: Not a conda environment: {prefix}", file=sys.stderr)
        return 1
    env = dict(os.environ, CONDA_PREFIX=prefix, CONDA_DEFAULT_ENV=name or prefix, CONDA_SHLVL="1",
               PATH=os.path.join(prefix, "bin") + ":" + os.environ.get("PATH", "/usr/bin:/bin"))
    with open(os.path.join(root, "run.log"), "a") as log:
        log.write(json.dumps(cmd) + "\n")
    out = subprocess.PIPE if capture else None
    child = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=out)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, f: child.send_signal(s))
    stdout, stderr = child.communicate()
    if capture:
        sys.stdout.buffer.write(stdout or b"")
        sys.stderr.buffer.write(stderr or b"")
    return child.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
