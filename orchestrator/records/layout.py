"""The names of the files in a controller run record: the one place they are spelled.

Layout (``<state_dir>/runs/<run_id>/``)::

    events.jsonl          one JSON object per event (time, event, host, task, ...)
    run.json              command, options, inventory path, playbook, hosts
    recap.json            every host's result (tune, rollback, recover runs)
    bench.json            every host's benchmark (`orch bench`)
    doctor.json           every unit's diagnosis (`orch doctor`)
    report.html           the HTML report (`orch report`, or after `orch tune`)
    debug.log             warnings and errors the libraries logged (Paramiko's tracebacks of a
                          failed handshake), kept out of the terminal; made only when one came
    hosts/<host>/         probe.json, install_manifest.json, configs/*.json (the tuned up and down
                          files), report.json (the tuner's), bench_<label>.json (one per bench
                          task: bench_before.json, bench_after.json, bench_bench.json), result.json,
                          runner_reference_answers.json (a runner trial's reference answers)

The tasks write the per-host files (:func:`host_dir` is where), the commands the run-level ones;
the report, ``orch bench`` and ``orch runs`` read them by these names.
"""

from __future__ import annotations

from pathlib import Path

#: The folder of ``<state_dir>`` holding one folder per run.
RUNS = "runs"
EVENTS = "events.jsonl"
RUN = "run.json"
RECAP = "recap.json"
BENCH_SUMMARY = "bench.json"
DOCTOR = "doctor.json"
REPORT_HTML = "report.html"
#: Warnings and errors logged by the libraries (Python's logging) while the run was open.
DEBUG_LOG = "debug.log"
#: The folder of a run holding one folder per host.
HOSTS = "hosts"

# per host
PROBE = "probe.json"
INSTALL_MANIFEST = "install_manifest.json"
#: The folder of a host's tuned (or imported) up and down config files.
CONFIGS = "configs"
#: The tuner's ``report.json``, fetched from the host (or copied from the store).
TUNE_REPORT = "report.json"
RESULT = "result.json"
#: the runner trial reference's greedy answers to the check prompts (runner_reference writes them,
#: runner_trial compares each candidate's with them)
REFERENCE_ANSWERS = "runner_reference_answers.json"

#: The ``label`` of the bench task in playbooks/bench.yaml (``orch bench``): its file is
#: ``bench_file(BENCH_LABEL)``.
BENCH_LABEL = "bench"


def bench_file(label: str) -> str:
    """The file a ``bench`` task with this ``label`` writes in its host's folder: ``bench_<label>.json``."""
    return f"bench_{label}.json"


def host_dir(run_dir: Path, host: str) -> Path:
    """The folder of ``host`` in the run record ``run_dir``: ``<run_dir>/hosts/<host>``."""
    return Path(run_dir) / HOSTS / host
