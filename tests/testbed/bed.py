"""The test bed: GPU hosts reachable over real SSH, each in its own network namespace.

Every host (``gpu-a``, ``gpu-b``, ...) is

- a network namespace ``orchtb-<bed id>-<name>`` joined to the root namespace by a veth pair;
  its /24 is ``10.213.<k>.0/24`` (``k`` free at creation), the root end is ``.1``, the host ``.2``;
- a PID 1 (``tests/testbed/hostinit.py``) started as
  ``ip netns exec NS unshare --mount --pid --uts --fork --mount-proc ...`` that bind-mounts the
  host's own ``/etc/systemd/system``, ``/root/.ssh``, ``/opt/sglang`` (its own copy of the
  stand-in SGLang tree), ``/var/lib/orch``, ``/models`` (``tiny-moe/config.json``), ``/run``,
  ``/var/log``, ``/tmp``, ``/srv``, ``/etc/sudoers.d`` and the login user's home ``/home/orchop``,
  ``/usr/bin/systemctl`` and ``/usr/bin/journalctl`` (wrappers for
  docker-systemctl-replacement), and a private ``/dev`` with fake ``/dev/nvidia0..``,
  ``/dev/nvidiactl``; then runs sshd (port 22, own host key) and starts the unit
  ``sglang-qwen.service`` (a real unit file running the stand-in with the repo's venv python);
- two logins over SSH with the bed's key: ``root``, and the non-root ``orchop`` (``LOGIN_USER``,
  an account of this machine made by :func:`ensure_login_user`) that may use ``sudo`` with its
  password inside the host only; sudo logs each of its commands to ``/var/log/sudo-orchop.log``;
- two processes holding ``/dev/nvidia0`` that are children of the host's PID 1: a leftover
  ``sglang::scheduler_TP0`` and ``nvidia-persistenced`` (which a reap must spare).

Real-fleet variants (issue 13, ``FLEET_OPTION_DEFAULTS``): units with ``EnvironmentFile=`` and
``--config`` files, other ``--host``/``--port`` binds, several units per host with GPUs named by
UUID (and a fake ``nvidia-smi``), a state folder shared with another host.

Only loopback and these namespaces are ever addressed. The hosts share the root file system
otherwise; the empty mount points ``/models``, ``/opt/sglang``, ``/var/lib/orch``, ``/root/.ssh``,
``/home/orchop`` are created on it when missing.

State of each bed lives in ``/run/orchtb/<bed id>/state.json`` so that ``cleanup_stale()``
(run by ``TestBed`` and ``python -m tests.testbed up``) removes namespaces, processes and veths
left by crashed runs, and ``down`` finds persistent beds. Needs root, iproute2, util-linux,
openssh-server (``tests/testbed/setup.sh``).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

from tests.waiting import CEILING_S, Stalled, Watch, files_state, wait_until

from . import standin_tree, vllm_tree

REPO = Path(__file__).resolve().parents[2]
# The interpreter of the hosts' units and of the payload (has torch + triton): the repo's venv,
# else the interpreter running the bed.
VENV_PYTHON = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv" / "bin" / "python").exists() \
    else sys.executable
VENV_BIN = os.path.dirname(VENV_PYTHON)
SYSTEMCTL3 = os.path.join(VENV_BIN, "systemctl3") if os.path.exists(os.path.join(VENV_BIN, "systemctl3")) \
    else (shutil.which("systemctl3") or os.path.join(VENV_BIN, "systemctl3"))
HOSTINIT = str(Path(__file__).resolve().parent / "hostinit.py")
JOURNAL_SHIM = str(Path(__file__).resolve().parent / "journalctl_shim.py")
SYSTEMCTL_SHIM = str(Path(__file__).resolve().parent / "systemctl_shim.py")
SYSTEMD_RUN = str(Path(__file__).resolve().parent / "systemd_run.py")
STATE_ROOT = Path(os.environ.get("ORCH_TESTBED_STATE", "/run/orchtb"))
NS_PREFIX = "orchtb-"
SUBNET_PREFIX = "10.213"  # hosts get 10.213.<k>.0/24, k in 1..254
DEFAULT_UNIT = "sglang-qwen"
SGLANG_PORT = 30000
#: non-root login of every bed host (an account of this machine, shared by the hosts through /etc/passwd and
#: /etc/shadow). Its home and the sudoers drop-in are per host (binds): it may use sudo, with its password,
#: only inside bed hosts; sudo logs each of its commands to SUDO_LOG of the host.
LOGIN_USER = "orchop"
LOGIN_HOME = f"/home/{LOGIN_USER}"
LOGIN_COMMENT = "orch test bed login (sudo only inside bed hosts)"  # marks the account the bed made
SUDO_LOG = f"/var/log/sudo-{LOGIN_USER}.log"
#: empty folders of this machine that the hosts' own folders are bound onto (path, mode when made)
MOUNT_POINTS = [("/models", 0o755), ("/opt/sglang", 0o755), ("/var/lib/orch", 0o755), (LOGIN_HOME, 0o700),
                ("/root/.ssh", 0o700)]

TINY_MOE_CONFIG: Dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 128,
    "moe_intermediate_size": 64,
    "intermediate_size": 256,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "torch_dtype": "bfloat16",
}

#: A tiny DeepSeek-V3-architecture model with block-FP8 experts (the checkpoint's own
#: ``quantization_config``, as DeepSeek-V3 ships it), for hosts whose runner SGLang picks by model.
TINY_DEEPSEEK_FP8_CONFIG: Dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 256,
    "moe_intermediate_size": 128,
    "intermediate_size": 512,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 129280,
    "torch_dtype": "bfloat16",
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
}

#: Named host presets (``TestBed(host_options={name: dict(HOST_PRESETS[...], ...)})``).
#: ``b200-deepseek-fp8``: a B200 (compute capability 10.0) serving a DeepSeek-V3-architecture
#: fp8 model with no ``--moe-runner-backend``: SGLang 0.5.23 resolves ``auto`` to
#: ``flashinfer_trtllm`` (``srt/arg_groups/overrides.py`` ``_deepseek_moe_quant_resolution``), reads
#: no Triton file, and autotunes FlashInfer at start into ``$SGLANG_CACHE_DIR`` (``/srv/sglang-cache``
#: inside the host; the stand-in ``flashinfer`` package is version 0.6.9).
#: vLLM hosts (issue 29; option ``engine``, ``VLLM_OPTION_DEFAULTS``), each a unit ``vllm-qwen`` on port
#: 8000 (vLLM's default) serving the tiny Qwen3 MoE model, no strays: ``vllm-serve`` (``vllm serve
#: MODEL``), ``vllm-module`` (``python -m vllm.entrypoints.openai.api_server --model ...``),
#: ``vllm-container`` (``docker run ... vllm/vllm-openai:vX MODEL ...``, the image's entry point ``vllm serve``, with
#: ``-v /srv/moe:/moe -e VLLM_TUNED_CONFIG_FOLDER=/moe``), ``vllm-flashinfer`` (``--moe-backend
#: flashinfer_cutlass``: a MoE kernel that reads no Triton file); ``vllm-tuned-folder``:
#: ``vllm-serve`` with ``VLLM_TUNED_CONFIG_FOLDER=/srv/vllm-moe``.
_VLLM_BASE: Dict[str, Any] = {"engine": "vllm", "unit": "vllm-qwen", "port": 8000, "strays": False}
HOST_PRESETS: Dict[str, Dict[str, Any]] = {
    "b200-deepseek-fp8": {"gpu_name": "NVIDIA B200", "gpu_capability": "10.0", "model_config": TINY_DEEPSEEK_FP8_CONFIG,
                          "flashinfer_version": "0.6.9"},
    "vllm-serve": dict(_VLLM_BASE, vllm_launch="serve"),
    "vllm-module": dict(_VLLM_BASE, vllm_launch="module"),
    "vllm-container": dict(_VLLM_BASE, container={"runtime": "docker", "moe_mount": True}),
    "vllm-flashinfer": dict(_VLLM_BASE, vllm_launch="serve", backend="flashinfer_cutlass"),
    "vllm-tuned-folder": dict(_VLLM_BASE, vllm_launch="serve", moe_config_dir="/srv/vllm-moe"),
}


def mixed_fleet_options() -> Dict[Any, Dict[str, Any]]:
    """``host_options`` of a two-host bed with one SGLang host (``gpu-a``, the bed's default unit
    ``sglang-qwen``) and one vLLM host (``gpu-b``, ``vllm-serve``): one inventory, both engines."""
    return {"gpu-a": {"strays": False}, "gpu-b": dict(HOST_PRESETS["vllm-serve"])}

# Per-host options (``TestBed(host_options={name_or_index: {...}})``); defaults here.
HOST_OPTION_DEFAULTS: Dict[str, Any] = {
    "gpu_name": "NVIDIA H200",      # ORCH_STANDIN_GPU_NAME
    "gpu_capability": "9.0",        # the GPU's compute capability, for orch's inventory (the bed has no CUDA)
                                    # and the stand-in (ORCH_STANDIN_GPU_CAPABILITY: the runner it resolves)
    "flashinfer_version": None,     # a stand-in flashinfer package of this version in the tree (None: none);
                                    # then SGLANG_CACHE_DIR defaults to /srv/sglang-cache (per host)
    "n_gpus": 1,                    # /dev/nvidia0..n-1
    "backend": None,                # --moe-runner-backend (None: flag omitted, SGLang's auto)
    "moe_config_dir": None,         # SGLANG_MOE_CONFIG_DIR inside the host (created, with configs/)
    "layout": "current",            # stand-in tree layout: "current" (SGLang 0.5.23) | "old" (0.5.8)
    "sglang_release": None,         # SGLang release whose real lookup module the stand-in runs
                                    # (None: the layout's; else its own layout, "layout" ignored)
    "tp": 1,                        # --tp
    "model_config": None,           # dict replacing the tiny-moe config.json
    "config_files": {},             # name -> dict|str pre-installed before start (see _config_target)
    "env": {},                      # extra Environment= of the unit (ORCH_STANDIN_* fault knobs...)
    "extra_args": [],               # extra launch_server flags
    "unit": DEFAULT_UNIT,           # unit name (without .service)
    "warmup_s": 1.0,                # ORCH_STANDIN_WARMUP_S
    "strays": True,                 # leftover scheduler + nvidia-persistenced holding /dev/nvidia0
    "gpu_exclusive": False,         # ORCH_STANDIN_GPU_EXCLUSIVE: start fails while a leftover holds the GPU
    "start_unit": True,             # start the unit at bed creation
    "timeout_stop_s": 15,           # TimeoutStopSec of the unit
    "service_lines": [],            # more [Service] lines, e.g. StandardOutput=append:/var/log/sglang.log
    "systemd_run": True,            # /usr/local/sbin/systemd-run: the stand-in (tests/testbed/systemd_run.py);
                                    # False: none (the machine's own, if any, finds no systemd as PID 1)
    "journalctl_version": 252,      # the systemd version the journalctl shim stands for: --invocation=ID
                                    # only from 257 (journalctl_shim.py); Debian 12 / RHEL 9 have 252
    # --- SSH variants (fleet SSH: bastions, host keys, hardened sshd) ---
    "sftp": True,                   # False: sshd_config without `Subsystem sftp` (hardened sshd)
    "sshd_extra_ports": [],         # more `Port`s sshd listens on besides 22
    "host_certificate": False,      # sshd also presents its host key signed by the bed's host CA
    "ssh_only_via": None,           # name of another bed host (a bastion): SSH logins only from it,
                                    # over a private link between the two namespaces
    "sshd_max_startups": "100:30:200",  # sshd's MaxStartups (start:rate:full, or one number): e.g.
                                    # "2:100:2" drops every unauthenticated connection past 2 at once
    "sshd_max_sessions": 100,       # sshd's MaxSessions: session channels allowed per connection
    "cluster_with": None,           # name of another bed host: a private link between the two
                                    # namespaces, a route to each other's address over it, and each
                                    # other's name in /etc/hosts (the ranks of a multi-node server)
}

# --- Real fleets (issue 13): unit variants and shared hosts. Kept apart from the options above so
# that other variants can be added beside them; every default leaves the host as before.
FLEET_OPTION_DEFAULTS: Dict[str, Any] = {
    "files": {},             # {absolute path inside the host: text} written before the units start
                             #   (per-host mounts, plus FLEET_ETC_DIRS which get a per-host folder)
    "env_files": [],         # EnvironmentFile= values of the unit, e.g. ["-/etc/default/sglang-qwen"]
    "launch_args": None,     # None: the usual --model-path/--tp/--port/--host; else the whole list of
                             #   flags after `-m sglang.launch_server` (e.g. ["--config", "/etc/sglang/q.yaml"])
    "port": SGLANG_PORT,     # the port the unit listens on (its --port, or the one its --config names)
    "bind_host": "0.0.0.0",  # --host of the unit; None: flag omitted (SGLang binds 127.0.0.1);
                             #   "address": the host's own address (127.0.0.1 is then refused)
    "gpus": None,            # GPU indices the unit opens (None: 0..tp-1)
    "cvd": None,             # CUDA_VISIBLE_DEVICES of the unit for those GPUs: None (unset), "index", "uuid"
    "more_units": [],        # further SGLang units on this host, each {"unit", "port", "gpus", "cvd", "env"}
    "nvidia_smi": False,     # /usr/local/sbin/nvidia-smi (tests/testbed/nvidia_smi.py) for the host's GPUs
    "mig": {},               # {gpu index: [MIG profile, ...]} listed by that nvidia-smi
    "dmesg": False,          # /usr/local/sbin/dmesg (tests/testbed/dmesg_standin.py): the kernel log
                             #   lines a test writes to /run/orchtb/dmesg.json
    "shares_state_with": None,  # an earlier host's name: this host mounts that host's /var/lib/orch
                                #   (one orch state folder on NFS, or hosts cloned with one data disk)
    "container": None,       # the unit runs the stand-in in a real podman container (issue 19):
                             #   {"moe_mount": True}: `-v /srv/moe:/moe -e SGLANG_MOE_CONFIG_DIR=/moe`
                             #   (moe_config_dir is then /srv/moe); {"moe_mount": False}: no such mount;
                             #   "runtime": "docker": `/usr/bin/docker run ... --gpus all`, the docker
                             #   stand-in over podman (tests/testbed/docker_shim.py); default "podman";
                             #   "sdnotify": "conmon" adds podman's --sdnotify=conmon (a Type=notify unit);
                             #   "cdi": True (podman): the GPU through CDI, `--device nvidia.com/gpu=all`,
                             #   with a stand-in driver's spec in the host's /etc/cdi (CDI_DRIVER)
}
HOST_OPTION_DEFAULTS.update(FLEET_OPTION_DEFAULTS)
# --- Launch forms and unit shapes (issue 19). Every default leaves the host as before.
LAUNCH_OPTION_DEFAULTS: Dict[str, Any] = {
    "exec_start": None,      # None: `<venv python> -m sglang.launch_server ARGS`; else the ExecStart= value,
                             #   a template with {python} (the venv python), {sglang} (the tree's console
                             #   script /opt/sglang/bin/sglang), {conda} (the conda stand-in) and {args}
                             #   (the launch flags, quoted), e.g. "-numactl -N 0 {sglang} serve {args}"
    "unit_lines": [],        # more [Service] lines (Type=, Restart=, KillMode=, ExecStartPre=, ...); a key
                             #   given here replaces the bed's own line for it (Type=, Restart=, ...)
    "user_unit": False,      # the unit is LOGIN_USER's own (systemctl --user): its file in
                             #   ~/.config/systemd/user, run as that user by the replacement's --user
                             #   mode; the inventory logs in as that user (become with its password)
                             #   with orch_systemd_scope: user (see user_unit_binds for /root)
}
HOST_OPTION_DEFAULTS.update(LAUNCH_OPTION_DEFAULTS)
# --- vLLM hosts (issue 29). Every default leaves the host as before.
VLLM_OPTION_DEFAULTS: Dict[str, Any] = {
    "engine": "sglang",      # "vllm": the unit runs the stand-in vLLM (tests/testbed/vllm_tree.py at /srv/vllm):
                             #   model /models/tiny-moe, -tp, --port/--host as for SGLang, `backend` as
                             #   --moe-backend; `container` runs the vllm/vllm-openai stand-in image
    "vllm_release": None,    # the release whose files the tree holds (None: tests.vllm_releases.NEWEST)
    "vllm_launch": "serve",  # "serve": `/srv/vllm/bin/vllm serve /models/tiny-moe ...` (the console script);
                             #   "module": `<python> -m vllm.entrypoints.openai.api_server --model /models/tiny-moe ...`
}
HOST_OPTION_DEFAULTS.update(VLLM_OPTION_DEFAULTS)
#: where a vLLM host's stand-in tree sits (inside the host's own /srv)
VLLM_TREE = "/srv/vllm"
#: the stand-in of vLLM's server image on vLLM container hosts (its ENTRYPOINT is `vllm serve`, as vLLM's since 0.11.1)
VLLM_IMAGE = "docker.io/vllm/vllm-openai:v{release}"
#: the console script of each host's stand-in tree (as pip writes one: shebang, then SGLang's main)
SGLANG_SCRIPT = "/opt/sglang/bin/sglang"
#: the conda stand-in (tests/testbed/conda_standin.py) and its one environment, ``sglang``
CONDA = "/opt/sglang/conda/bin/conda"
CONDA_ENV = "/opt/sglang/conda/envs/sglang"
#: /etc folders a host gets its own copy of when ``files`` writes into them (the machine's content
#: first, so nothing else there disappears inside the host)
FLEET_ETC_DIRS = ("/etc/default", "/etc/sglang")
#: PCI bus ids of an 8-GPU HGX H200 board, in nvidia-smi's order
PCI_BUS_IDS = ("00000000:18:00.0", "00000000:2A:00.0", "00000000:3A:00.0", "00000000:5D:00.0",
               "00000000:9A:00.0", "00000000:AB:00.0", "00000000:BA:00.0", "00000000:DB:00.0")
NVIDIA_SMI = str(Path(__file__).resolve().parent / "nvidia_smi.py")
DMESG = str(Path(__file__).resolve().parent / "dmesg_standin.py")


def gpu_uuid(host_name: str, index: int, kind: str = "GPU") -> str:
    """Stable UUID of GPU ``index`` of host ``host_name`` (``GPU-8-4-4-4-12`` hex, as nvidia-smi
    prints it; ``kind`` ``MIG`` for a MIG device)."""
    h = hashlib.sha256(f"{kind}:{host_name}:{index}".encode()).hexdigest()
    return f"{kind}-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _everyone_can_run(path: str) -> bool:
    """True when any user may execute ``path`` (its real file and every folder above it have o+x)."""
    real = os.path.realpath(path)
    try:
        if not os.stat(real).st_mode & stat.S_IXOTH:
            return False
        d = os.path.dirname(real)
        while True:
            if not os.stat(d).st_mode & stat.S_IXOTH:
                return False
            if d == "/":
                return True
            d = os.path.dirname(d)
    except OSError:
        return False


def _shim_python() -> str:
    """The interpreter of the host's stdlib-only shims: the venv's when everyone may run it."""
    return VENV_PYTHON if _everyone_can_run(VENV_PYTHON) or not _everyone_can_run("/usr/bin/python3") \
        else "/usr/bin/python3"


def _systemctl_wrapper(run_dir: Path) -> str:
    """Text of the host's ``/usr/bin/systemctl``: ``systemctl_shim.py`` (transient units of the
    systemd-run stand-in) in front of docker-systemctl-replacement. Every login runs it
    (``systemctl show`` needs no root), so when the venv's interpreter is not executable by
    everyone (e.g. a pyenv Python under /root), the stdlib-only ``systemctl3.py`` is copied into
    the host's ``/run/orchtb`` (``run_dir``) and run by ``/usr/bin/python3``."""
    shutil.copy(SYSTEMCTL_SHIM, run_dir / "systemctl_shim.py")
    os.chmod(run_dir / "systemctl_shim.py", 0o644)
    if _shim_python() == VENV_PYTHON:
        real = [SYSTEMCTL3]
    else:
        module = _run([VENV_PYTHON, "-c", "import systemctl2.systemctl3 as m; print(m.__file__)"]).stdout.strip()
        shutil.copy(module, run_dir / "systemctl3.py")
        os.chmod(run_dir / "systemctl3.py", 0o644)
        real = ["/usr/bin/python3", "/run/orchtb/systemctl3.py"]
    return (f"#!/bin/sh\nORCHTB_SYSTEMCTL_REAL={shlex.quote(json.dumps(real))} "
            f"exec {shlex.quote(_shim_python())} /run/orchtb/systemctl_shim.py \"$@\"\n")


class TestBedError(RuntimeError):
    """The bed could not be created or a host command failed."""


def _run(cmd: List[str], check: bool = True, **kw: Any) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _veth_pair(a: tuple[str, str, str], b: tuple[str, str, str]) -> None:
    """A veth pair straight between two namespaces: ``a`` and ``b`` are ``(namespace, device name,
    address)``, each end given its address on a /30 and brought up (never in the root namespace)."""
    (ns_a, dev_a, addr_a), (ns_b, dev_b, addr_b) = a, b
    _run(["ip", "link", "add", dev_a, "netns", ns_a, "type", "veth", "peer", "name", dev_b, "netns", ns_b])
    for ns, dev, addr in (a, b):
        _run(["ip", "-n", ns, "addr", "add", f"{addr}/30", "dev", dev])
        _run(["ip", "-n", ns, "link", "set", dev, "up"])


def _proc_start_time(pid: int) -> Optional[str]:
    """Start time (clock ticks since boot, field 22 of /proc/PID/stat) or None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _max_startups(value: Any) -> str:
    """``sshd_max_startups`` checked as sshd_config(5) reads it (``N`` or ``start:rate:full``),
    so a typo fails the bed at once instead of an sshd that will not start."""
    text = str(value)
    if not re.fullmatch(r"\d+(:\d+:\d+)?", text):
        raise TestBedError(f"sshd_max_startups: {value!r} is not N or start:rate:full")
    return text


def _alive(pid: Optional[int], start: Optional[str]) -> bool:
    return bool(pid) and _proc_start_time(pid) is not None and (start is None or _proc_start_time(pid) == start)


def process_gone(pid: int) -> bool:
    """True when ``pid`` no longer runs: no /proc entry, or a zombie waiting for its parent to reap it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def _wait_gone(pids: List[int]) -> None:
    """Poll until every PID in ``pids`` is gone (or a zombie); while fewer are left each time, the
    wait goes on (tests/waiting.py); a stall gives up, as the clean-up is best effort."""
    left = lambda: [p for p in pids if not process_gone(p)]  # noqa: E731
    try:
        wait_until(lambda: not left(), "the processes' end", progress=[lambda: len(left())], poll=0.02)
    except Stalled:
        pass


@contextmanager
def _state_lock() -> Iterator[None]:
    STATE_ROOT.mkdir(parents=True, exist_ok=True)
    with open(STATE_ROOT / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def list_namespaces() -> List[str]:
    """Names of the test bed's network namespaces (``orchtb-*``) that exist now."""
    out = _run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(NS_PREFIX)]


def _kill_ns_processes(ns: str) -> None:
    pids = _run(["ip", "netns", "pids", ns], check=False).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def _delete_ns(ns: str, veth: Optional[str] = None) -> None:
    _kill_ns_processes(ns)
    left = lambda: _run(["ip", "netns", "pids", ns], check=False).stdout.split()  # noqa: E731
    try:  # SIGKILLed: they go as fast as the kernel reaps them; a stall gives up (best effort)
        wait_until(lambda: not left(), f"the end of {ns}'s processes", progress=[lambda: len(left())], poll=0.05)
    except Stalled:
        pass
    _run(["ip", "netns", "del", ns], check=False)
    if veth:
        _run(["ip", "link", "del", veth], check=False)


def _bed_is_live(state: Dict[str, Any]) -> bool:
    """A bed is live while its creating process runs, or (persistent beds) while a host's PID 1 runs."""
    if _alive(state.get("owner_pid"), state.get("owner_start")):
        return True
    return bool(state.get("persistent")) and any(
        _alive(h.get("init_pid"), h.get("init_start")) for h in state.get("hosts", []))


def destroy_bed_state(bed_id: str) -> None:
    """Remove everything of bed ``bed_id``: its hosts' processes, namespaces, veths, state dir
    (and its work folder if the bed created it)."""
    sdir = STATE_ROOT / bed_id
    state: Dict[str, Any] = {}
    try:
        state = json.loads((sdir / "state.json").read_text())
    except (OSError, ValueError):
        pass
    killed: List[int] = []
    for h in state.get("hosts", []):
        if _alive(h.get("init_pid"), h.get("init_start")):
            try:
                os.kill(h["init_pid"], signal.SIGKILL)
                killed.append(h["init_pid"])
            except ProcessLookupError:
                pass
    _wait_gone(killed)  # SIGKILL is asynchronous: the init exits when the kernel gets to it
    for ns in list_namespaces():
        if ns.startswith(f"{NS_PREFIX}{bed_id}-"):
            veth = next((h.get("veth") for h in state.get("hosts", []) if h.get("ns") == ns), None)
            _delete_ns(ns, veth)
    for h in state.get("hosts", []):
        if h.get("veth"):
            _run(["ip", "link", "del", h["veth"]], check=False)
    if state.get("owns_workdir") and state.get("workdir"):
        shutil.rmtree(state["workdir"], ignore_errors=True)
    for key in ("inventory", "known_hosts_copy"):  # files `python -m tests.testbed up` wrote
        path = (state.get("extra") or {}).get(key)
        if path:
            try:
                os.unlink(path)
            except OSError:
                pass
    shutil.rmtree(sdir, ignore_errors=True)


def cleanup_stale() -> List[str]:
    """Remove beds whose owner is gone (or persistent beds whose hosts all died) and ``orchtb-*``
    namespaces that belong to no known bed. Live beds of other processes are left alone.
    Returns the removed bed ids / namespace names."""
    removed: List[str] = []
    with _state_lock():
        known = set()
        if STATE_ROOT.exists():
            for sdir in STATE_ROOT.iterdir():
                if not sdir.is_dir():
                    continue
                try:
                    state = json.loads((sdir / "state.json").read_text())
                except (OSError, ValueError):
                    state = None
                if state is not None and _bed_is_live(state):
                    known.add(sdir.name)
                    continue
                if state is None and time.time() - sdir.stat().st_mtime < 60:
                    known.add(sdir.name)  # being created right now
                    continue
                destroy_bed_state(sdir.name)
                removed.append(sdir.name)
        for ns in list_namespaces():
            bed_id = ns[len(NS_PREFIX):].split("-", 1)[0]
            if bed_id not in known:
                _delete_ns(ns)
                removed.append(ns)
        # veths whose namespace is gone disappear with it; stray root ends of our naming:
        out = _run(["ip", "-o", "link", "show"], check=False).stdout
        for line in out.splitlines():
            parts = line.split(":")
            if len(parts) > 1:
                name = parts[1].strip().split("@")[0]
                if name.startswith("otb") and len(name) == 9 and name[3:7] not in known:
                    _run(["ip", "link", "del", name], check=False)
                    removed.append(name)
    return removed


def ensure_login_user() -> str:
    """Create the bed's login user ``LOGIN_USER`` on this machine if missing (idempotent, under the
    state lock) and return its password. The password is random, made once per machine, set with
    ``chpasswd`` and kept only in ``STATE_ROOT/<user>.password`` (mode 0600, root). The user has
    no sudo rights on this machine (the drop-in exists only inside bed hosts). Also creates the
    empty mount points of the hosts' own folders (:data:`MOUNT_POINTS`, recorded when made, see
    :func:`remove_machine_setup`). Raises TestBedError when ``useradd``/``chpasswd`` fail."""
    pw_file = STATE_ROOT / f"{LOGIN_USER}.password"
    with _state_lock():
        if _run(["getent", "passwd", LOGIN_USER], check=False).returncode != 0:
            r = _run(["useradd", "--no-create-home", "--home-dir", LOGIN_HOME, "--shell", "/bin/sh",
                      "--comment", LOGIN_COMMENT, LOGIN_USER], check=False)
            if r.returncode != 0:
                raise TestBedError(f"useradd {LOGIN_USER} failed: {r.stderr.strip()}")
        try:
            password = pw_file.read_text().strip()
        except FileNotFoundError:
            password = ""
        status = _run(["passwd", "--status", LOGIN_USER], check=False).stdout.split()
        if not password or status[1:2] != ["P"]:  # new, or the account has no usable password
            password = password or secrets.token_urlsafe(24)
            r = _run(["chpasswd"], check=False, input=f"{LOGIN_USER}:{password}\n")
            if r.returncode != 0:
                raise TestBedError(f"chpasswd for {LOGIN_USER} failed: {r.stderr.strip()}")
            tmp = pw_file.with_suffix(".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(password + "\n")
            tmp.replace(pw_file)
        _make_mount_points()
    return password


def _make_mount_points() -> None:
    """Create the missing empty mount points of :data:`MOUNT_POINTS` on this machine and record
    the ones made in ``STATE_ROOT/made_paths.json`` (so that :func:`remove_machine_setup` removes
    only what the bed made). Call under the state lock."""
    record = STATE_ROOT / "made_paths.json"
    try:
        made = json.loads(record.read_text())
    except (OSError, ValueError):
        made = []
    for path, mode in MOUNT_POINTS:
        missing = [p for p in [path] + [str(a) for a in Path(path).parents] if not os.path.exists(p)]
        os.makedirs(path, mode=mode, exist_ok=True)
        made += [p for p in reversed(missing) if p not in made]  # parents first
    record.write_text(json.dumps(made))


def remove_machine_setup() -> Optional[List[str]]:
    """Undo what the beds set up on this machine itself, once no bed is left: the login user
    ``LOGIN_USER`` (only the account :func:`ensure_login_user` made, recognised by its comment),
    its password file, and the empty mount points the beds made (never a folder that existed
    before or holds anything). Does nothing while any bed state or ``orchtb-*`` namespace
    exists (tests of another process may be using the user). Returns what was removed (list of
    str), or None when it did nothing because a bed is left; ``/run/orchtb/.lock`` (an empty file
    on tmpfs) stays so concurrent runs keep one lock."""
    removed: List[str] = []
    with _state_lock():
        if any(d.is_dir() for d in STATE_ROOT.iterdir()) or list_namespaces():
            return None
        entry = _run(["getent", "passwd", LOGIN_USER], check=False).stdout.split(":")
        if len(entry) > 4 and entry[4] == LOGIN_COMMENT:
            r = _run(["userdel", LOGIN_USER], check=False)
            if r.returncode != 0:
                raise TestBedError(f"userdel {LOGIN_USER} failed: {r.stderr.strip()}")
            removed.append(f"user {LOGIN_USER}")
        pw_file = STATE_ROOT / f"{LOGIN_USER}.password"
        if pw_file.exists():
            pw_file.unlink()
            removed.append(str(pw_file))
        record = STATE_ROOT / "made_paths.json"
        try:
            made = json.loads(record.read_text())
        except (OSError, ValueError):
            made = []
        for path in reversed(made):  # children before parents
            try:
                os.rmdir(path)
                removed.append(path)
            except OSError:
                pass  # not empty (something else uses it now) or already gone
        record.unlink(missing_ok=True)
    return removed


def sudoers_text(user: str = LOGIN_USER, log: str = SUDO_LOG) -> str:
    """The bed hosts' sudoers drop-in: ``user`` may run any command as any user with its own
    password (asked every time), without a tty; sudo logs every command, one line each, to ``log``
    (a per-host file: /var/log is per host)."""
    return "\n".join([
        f"# orch test bed: the login user {user} may use sudo with its password; every command is logged",
        f"Defaults:{user} logfile={log}",
        f"Defaults:{user} loglinelen=0",
        f"Defaults:{user} !syslog",
        f"Defaults:{user} !requiretty",
        f"Defaults:{user} !lecture",
        f"Defaults:{user} !mail_badpass",
        f"Defaults:{user} timestamp_timeout=0",
        f"{user} ALL=(ALL) ALL",
        "",
    ])


def _used_subnets() -> set:
    used = set()
    out = _run(["ip", "-o", "-4", "addr", "show"], check=False).stdout
    for tok in out.split():
        if tok.startswith(SUBNET_PREFIX + "."):
            try:
                used.add(int(tok.split(".")[2]))
            except (IndexError, ValueError):
                pass
    if STATE_ROOT.exists():
        for sfile in STATE_ROOT.glob("*/state.json"):
            try:
                for h in json.loads(sfile.read_text()).get("hosts", []):
                    used.add(int(h["address"].split(".")[2]))
            except (OSError, ValueError, KeyError, IndexError):
                pass
    return used


@dataclass
class Host:
    """One test-bed host. ``address``/``port``/``user`` are what SSH uses; ``sh`` runs a command
    inside the host's namespaces directly (nsenter), not through SSH."""

    name: str
    address: str
    port: int
    user: str
    ns: str
    veth: str
    hostdir: Path
    options: Dict[str, Any]
    init_pid: int = 0
    init_start: Optional[str] = None
    triton_version: str = ""
    #: with ``ssh_only_via``: this host's and the bastion's address on their private link
    link_address: Optional[str] = None
    link_peer: Optional[str] = None
    #: with ``cluster_with``: the hosts this one reaches over a private link (both ends list each other)
    cluster_peers: List["Host"] = field(default_factory=list, repr=False, compare=False)
    _unshare: Optional[subprocess.Popen] = field(default=None, repr=False)

    # --- paths --------------------------------------------------------------------------
    @property
    def unit(self) -> str:
        """Name of the SGLang unit (without ``.service``)."""
        return self.options["unit"]

    @property
    def loader_dir(self) -> str:
        """Folder of the stand-in's loader module, as the host sees it (str)."""
        return "/opt/sglang/" + standin_tree.loader_dir(self.options["layout"])

    @property
    def config_dir(self) -> str:
        """The stand-in's configs root on the host (``.../configs``, or
        ``$SGLANG_MOE_CONFIG_DIR/configs`` when the host sets it), as the host sees it. On a vLLM host
        (option ``engine``): ``moe_config_dir`` itself (the unit's ``VLLM_TUNED_CONFIG_FOLDER``), else
        the tree's shipped ``configs/``."""
        if self.options.get("engine") == "vllm":
            return self.options["moe_config_dir"] or f"{VLLM_TREE}/{vllm_tree.FUSED_MOE}/configs"
        base = self.options["moe_config_dir"] or self.loader_dir
        return base.rstrip("/") + "/configs"

    @property
    def triton_dir(self) -> str:
        """``config_dir/triton_X_Y_Z`` for the Triton the stand-in sees on this host (vLLM: ``config_dir``,
        vLLM has no Triton folders)."""
        if self.options.get("engine") == "vllm":
            return self.config_dir
        return f"{self.config_dir}/triton_{self.triton_version.replace('.', '_')}"

    @property
    def url(self) -> str:
        """The unit's base URL as seen from inside the host (its own address when the unit binds
        only that, else 127.0.0.1)."""
        where = self.address if self.options.get("bind_host") == "address" else "127.0.0.1"
        return f"http://{where}:{self.options.get('port', SGLANG_PORT)}"

    def gpu_uuid(self, index: int) -> str:
        """UUID of this host's GPU ``index`` (what its nvidia-smi reports)."""
        return gpu_uuid(self.name, index)

    def local_path(self, path: str) -> Path:
        """Path in the root namespace of a file inside one of this host's own mounts
        (``/opt/sglang``, ``/var/lib/orch``, ``/etc/systemd/system``, ``/models``, ``/run``,
        ``/var/log``, ``/tmp``, ``/srv``, ``/root/.ssh``, ``/etc/sudoers.d``, ``/home/orchop``).
        ValueError for other paths."""
        for inside, local in _host_mounts(self.hostdir):
            if path == inside or path.startswith(inside.rstrip("/") + "/"):
                return Path(local) / os.path.relpath(path, inside)
        raise ValueError(f"{path} is not on a per-host mount of {self.name}")

    # --- commands -----------------------------------------------------------------------
    def sh(self, cmd: str, check: bool = True, timeout: float = CEILING_S,
           input: Optional[str] = None) -> subprocess.CompletedProcess:
        """Run ``cmd`` with /bin/sh inside the host's network, mount, UTS and PID namespaces
        (nsenter into its PID 1; not through SSH). Returns the CompletedProcess (text
        stdout/stderr). Raises TestBedError if ``check`` and the status is not 0. ``timeout`` is a
        hang guard only (tests/waiting.py's ceiling), never a wait on something."""
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
               "LANG": "C.UTF-8"}
        proc = subprocess.run(
            ["nsenter", "-t", str(self.init_pid), "-m", "-u", "-n", "-p", "--", "/bin/sh", "-c", cmd],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, timeout=timeout, input=input,
            cwd="/")
        if check and proc.returncode != 0:
            raise TestBedError(f"[{self.name}] `{cmd}` exited {proc.returncode}\nstdout: {proc.stdout}\n"
                               f"stderr: {proc.stderr}")
        return proc

    def py(self, code: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """Run Python ``code`` with the venv interpreter inside the host (``sys.argv[1:] = args``)."""
        return self.sh(" ".join([shlex.quote(VENV_PYTHON), "-c", shlex.quote(code)] + [shlex.quote(a) for a in args]),
                       check=check)

    def file_tree_hash(self, path: str) -> Dict[str, str]:
        """``{absolute path: sha256 hex}`` of every regular file under ``path`` inside the host
        ({} if ``path`` does not exist; a file path gives one entry)."""
        code = (
            "import hashlib,json,os,sys\n"
            "root=sys.argv[1]; out={}\n"
            "def h(p):\n"
            "    with open(p,'rb') as f: return hashlib.sha256(f.read()).hexdigest()\n"
            "if os.path.isfile(root): out[root]=h(root)\n"
            "for d,_,fs in os.walk(root):\n"
            "    for n in fs:\n"
            "        p=os.path.join(d,n)\n"
            "        if os.path.isfile(p) and not os.path.islink(p): out[p]=h(p)\n"
            "print(json.dumps(out))\n")
        return json.loads(self.py(code, path).stdout)

    def _user_unit(self, unit: Optional[str]) -> bool:
        """Whether ``unit`` (None: the host's SGLang unit) is LOGIN_USER's own (host option ``user_unit``)."""
        return bool(self.options.get("user_unit")) and (unit is None or unit == self.unit)

    def as_login_user(self, cmd: str) -> str:
        """``cmd`` run as LOGIN_USER with its home and the host's PATH (``runuser``), as its SSH
        logins run: what its own systemd manager (``systemctl --user``) and journal need."""
        return (f"runuser -u {LOGIN_USER} -- env HOME={LOGIN_HOME} USER={LOGIN_USER} LOGNAME={LOGIN_USER} "
                f"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin {cmd}")

    def systemctl(self, args: str, unit: Optional[str] = None, check: bool = False) -> subprocess.CompletedProcess:
        """``systemctl ARGS`` inside the host on the manager of ``unit`` (None: the host's SGLang
        unit): the system's, or LOGIN_USER's own (``systemctl --user``, as that user) for a user unit."""
        if self._user_unit(unit):
            return self.sh(self.as_login_user(f"systemctl --user {args}"), check=check)
        return self.sh(f"systemctl {args}", check=check)

    def unit_state(self, unit: Optional[str] = None) -> str:
        """``systemctl is-active UNIT`` inside the host (``active``, ``inactive``, ``failed``, ...);
        ``--user`` as LOGIN_USER for a user unit."""
        return self.systemctl(f"is-active {shlex.quote(unit or self.unit)}", unit).stdout.strip()

    def unit_log(self, unit: Optional[str] = None) -> str:
        """Whole log of the unit (``journalctl -u UNIT``, ``--user-unit`` as LOGIN_USER for a user
        unit; accumulates across restarts)."""
        if self._user_unit(unit):
            return self.sh(self.as_login_user(f"journalctl --user-unit {shlex.quote(unit or self.unit)} --no-pager"),
                           check=False).stdout
        return self.sh(f"journalctl -u {shlex.quote(unit or self.unit)} --no-pager", check=False).stdout

    def pids_holding(self, path: str = "/dev/nvidia0") -> List[Tuple[int, str]]:
        """``[(pid, cmdline)]`` of the host's processes with ``path`` open (host PIDs; cmdline
        arguments joined by spaces), sorted by pid."""
        code = (
            "import os,sys,json\n"
            "want=sys.argv[1]; out=[]\n"
            "for p in os.listdir('/proc'):\n"
            "    if not p.isdigit(): continue\n"
            "    try:\n"
            "        fds=os.listdir(f'/proc/{p}/fd')\n"
            "        hit=any(os.readlink(f'/proc/{p}/fd/{fd}')==want for fd in fds)\n"
            "        cmd=open(f'/proc/{p}/cmdline','rb').read().rstrip(b'\\0').replace(b'\\0',b' ').decode('utf-8','replace')\n"
            "    except OSError: continue\n"
            "    if hit: out.append([int(p),cmd])\n"
            "print(json.dumps(sorted(out)))\n")
        return [(pid, cmd) for pid, cmd in json.loads(self.py(code, path).stdout)]

    def wait_http(self, path: str = "/health", status: int = 200) -> float:
        """Poll ``GET url+path`` inside the host until it answers ``status``; returns seconds
        waited. Raises TestBedError when the unit is no longer active, or when it hangs: its
        logs under ``/var/log`` (journal, ``StandardOutput=`` files) did not grow for
        tests/waiting.py's stall while it was not answering."""
        code = (
            "import sys,time,urllib.request,urllib.error\n"
            "url,want,deadline=sys.argv[1],int(sys.argv[2]),time.time()+float(sys.argv[3]);t0=time.time()\n"
            "while time.time()<deadline:\n"
            "    try:\n"
            "        code=urllib.request.urlopen(url,timeout=2).status\n"
            "    except urllib.error.HTTPError as e: code=e.code\n"
            "    except OSError: code=None\n"
            "    if code==want: print(time.time()-t0); sys.exit(0)\n"
            "    time.sleep(0.1)\n"
            "sys.exit(3)\n")
        t0 = time.monotonic()
        watch = Watch([lambda: files_state(self.local_path("/var/log"))], what=f"{path} of {self.name}")
        # poll in short slices so a dead unit ends the wait early
        while True:
            r = self.py(code, self.url + path, str(status), "2", check=False)
            if r.returncode == 0:
                return time.monotonic() - t0
            if self.unit_state() not in ("active", "activating"):
                raise TestBedError(f"[{self.name}] unit {self.unit} is {self.unit_state()} while waiting for {path}")
            try:
                watch.check()
            except Stalled as exc:
                raise TestBedError(f"[{self.name}] {path} did not answer {status}: {exc}") from None


def _host_mounts(hostdir: Path) -> List[Tuple[str, str]]:
    """(path inside the host, local source) of every per-host folder bind."""
    h = str(hostdir)
    return [
        ("/etc/systemd/system", f"{h}/etc-systemd-system"),
        ("/root/.ssh", f"{h}/root-ssh"),
        ("/opt/sglang", f"{h}/opt-sglang"),
        ("/var/lib/orch", f"{h}/var-lib-orch"),
        ("/models", f"{h}/models"),
        ("/etc/sudoers.d", f"{h}/etc-sudoers.d"),
        (LOGIN_HOME, f"{h}/home-login"),
        ("/var/log", f"{h}/var-log"),
        ("/srv", f"{h}/srv"),
        ("/tmp", f"{h}/tmp"),
        ("/run", f"{h}/run"),
    ]


#: root's shell start-up files of the machine running the bed: a host's shells start without them
ROOT_STARTUP_FILES = ("/root/.bashrc", "/root/.profile", "/root/.bash_profile", "/root/.bash_login",
                      "/root/.bash_logout")


def _clean_shell_binds(hostdir: Path, candidates=ROOT_STARTUP_FILES) -> List[List[str]]:
    """Binds ``[empty file, path]`` over root's start-up files that exist on this machine.

    Bash sources ``~/.bashrc`` even for the non-interactive command sshd runs (Debian's bash), so
    every command orch sends a host would run the machine's own dotfiles: a developer's
    ``eval "$(pyenv init -)"`` runs ``pyenv rehash``, which takes a lock in the one ``/root/.pyenv``
    every host shares; a shell killed while holding it (a test run interrupted) made every later
    SSH command of every bed host wait on it until orch's 30 s command timeout. A bed host is
    another machine: its root starts clean."""
    empty = hostdir / "empty-startup-file"
    out: List[List[str]] = []
    for path in candidates:
        if os.path.isfile(path):
            empty.touch()
            out.append([str(empty), path])
    return out


def _hidden_code_binds(hostdir: Path, paths: Optional[List[str]] = None,
                       more_mounts: Tuple[str, ...] = ()) -> List[List[str]]:
    """Binds ``[source, same path]`` that keep the bed's own code visible inside a host: the
    repo (holder.py, the journalctl shim) and the venv (the units' interpreter, systemctl3) when
    they sit under a per-host mount such as ``/tmp`` (a clone in /tmp would otherwise vanish
    behind the host's own /tmp). ``paths`` defaults to the repo and the venv's root."""
    if paths is None:
        paths = [str(REPO), str(Path(VENV_PYTHON).parent.parent)]
    insides = [inside for inside, _ in _host_mounts(hostdir)] + list(more_mounts)
    out: List[List[str]] = []
    for p in dict.fromkeys(os.path.abspath(x) for x in paths):
        hidden = any(p == i or p.startswith(i.rstrip("/") + "/") for i in insides)
        covered = any(p == q or p.startswith(q.rstrip("/") + "/") for q, _ in out)
        if hidden and not covered:
            out.append([p, p])
    return out


def _cvd_value(host: Host, gpus: List[int], kind: Optional[str]) -> Optional[str]:
    """CUDA_VISIBLE_DEVICES naming ``gpus`` by index or by UUID (None: ``kind`` None)."""
    if kind is None:
        return None
    return ",".join(host.gpu_uuid(i) if kind == "uuid" else str(i) for i in gpus)


def _make_launchers(tree: Path) -> None:
    """In a host's stand-in tree (``/opt/sglang``): the ``sglang`` console script, written as pip
    writes one (shebang naming the venv python, then ``from sglang.cli.main import main``), and
    the conda stand-in with its environment ``sglang`` (whose ``bin/python`` runs the venv python,
    with ``/opt/sglang`` on its path as the unit's PYTHONPATH gives it)."""
    script = tree / "bin" / "sglang"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(f"#!{VENV_PYTHON}\n# -*- coding: utf-8 -*-\nimport re\nimport sys\n"
                      "from sglang.cli.main import main\n"
                      "if __name__ == '__main__':\n"
                      "    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n"
                      "    sys.exit(main())\n")
    conda = tree / "conda" / "bin" / "conda"
    conda.parent.mkdir(parents=True, exist_ok=True)
    conda.write_text(f"#!{VENV_PYTHON}\n" + (Path(__file__).parent / "conda_standin.py").read_text())
    env_bin = tree / "conda" / "envs" / "sglang" / "bin"
    env_bin.mkdir(parents=True, exist_ok=True)
    (env_bin.parent / "conda-meta").mkdir(exist_ok=True)
    for name in ("python", "python3"):
        (env_bin / name).write_text(f"#!/bin/sh\nexec {shlex.quote(VENV_PYTHON)} \"$@\"\n")
    for p in (script, conda, env_bin / "python", env_bin / "python3"):
        p.chmod(0o755)


#: the stand-in image of container hosts (``podman import`` of a tar the bed makes)
CONTAINER_IMAGE = "localhost/sglang-standin:0.5.23"
#: the image's Python: a link in the image to the repo's venv (bound read-only by containers.conf)
CONTAINER_PYTHON = "/opt/venv/bin/python3"


#: the docker stand-in (tests/testbed/docker_shim.py), at /usr/bin/docker of container hosts with runtime docker
DOCKER_SHIM = str(Path(__file__).parent / "docker_shim.py")


def container_runtime(host: Host) -> str:
    """``docker`` or ``podman``: the runtime of a container host's unit (host option ``container``)."""
    return (host.options["container"] or {}).get("runtime", "podman")


def container_name(host: Host) -> str:
    """The ``--name`` of a container host's container: ``vllm`` on vLLM hosts, else ``sglang``."""
    return "vllm" if host.options["engine"] == "vllm" else "sglang"


def vllm_image(host: Host) -> str:
    """The vLLM image name of a vLLM container host (``vllm/vllm-openai`` with the release's tag)."""
    from tests.vllm_releases import NEWEST
    return VLLM_IMAGE.format(release=host.options["vllm_release"] or NEWEST)


def _vllm_flags(host: Host) -> List[str]:
    """The vLLM unit's flags after the entry point (``vllm serve MODEL``: the model first)."""
    o = host.options
    model = "/models/tiny-moe"
    # `vllm serve MODEL` (the console script, and vLLM's image, whose ENTRYPOINT is `vllm serve`)
    flags = [model] if o["vllm_launch"] == "serve" else ["--model", model]
    flags += ["-tp", str(o["tp"]), "--port", str(o["port"])]
    if o["bind_host"] is not None:
        flags += ["--host", host.address if o["bind_host"] == "address" else o["bind_host"]]
    if o["backend"]:
        flags += ["--moe-backend", o["backend"]]
    return flags + [str(a) for a in o["extra_args"]]


def _container_exec(host: Host, args: List[str], env: Dict[str, str]) -> List[str]:
    """ExecStart of a container host: ``podman run --rm --name sglang -p PORT:PORT -v /models...
    [-v /srv/moe:/moe] -e ... IMAGE /opt/venv/bin/python3 -m sglang.launch_server ...``; the
    unit's environment goes in as ``-e`` (the container's), the fake GPU file as a bind. With
    runtime docker, as fleets write it: ``/usr/bin/docker run --rm --name sglang --gpus all
    -p ...`` (the stand-in gives the container the host's GPU files for ``--gpus``)."""
    o = host.options
    port = int(o["port"])
    env = dict(env)
    name = container_name(host)
    if container_runtime(host) == "docker":
        words = ["/usr/bin/docker", "run", "--rm", "--name", name, "--gpus", "all", "-p", f"{port}:{port}",
                 "-v", "/models:/models:ro"]
    else:
        words = ["/usr/bin/podman", "run", "--rm", "--name", name, "-p", f"{port}:{port}",
                 "-v", "/models:/models:ro"]
        if o["container"].get("cdi"):  # the GPU path through the CDI spec (cdi_spec)
            words += ["--device", "nvidia.com/gpu=all"]
        else:
            for i in range(max(1, int(o["tp"]))):
                words += ["-v", f"/dev/nvidia{i}:/dev/nvidia{i}"]
    if o["container"].get("sdnotify"):  # podman-run(1) --sdnotify: who tells systemd (Type=notify) it started
        words.append(f"--sdnotify={o['container']['sdnotify']}")
    if o["container"].get("moe_mount"):
        words += ["-v", f"{o['moe_config_dir']}:/moe"]
        env["VLLM_TUNED_CONFIG_FOLDER" if o["engine"] == "vllm" else "SGLANG_MOE_CONFIG_DIR"] = "/moe"
    if o["engine"] == "vllm":  # the image's own PYTHONPATH and ENTRYPOINT (`vllm serve`) run the tree
        env = {k: v for k, v in env.items() if k not in ("PYTHONPATH", "ORCH_STANDIN_VLLM_SRC")}
    for k, v in env.items():
        words += ["-e", f"{k}={v}"]
    if o["engine"] == "vllm":
        return words + [vllm_image(host)] + _vllm_flags(host)
    return words + [CONTAINER_IMAGE, CONTAINER_PYTHON] + args[1:]


#: the stand-in driver's version a CDI host starts with (its library /srv/nvidia-driver/libcuda.so.VERSION)
CDI_DRIVER = "550.54.15"


def cdi_spec(n_gpus: int, driver: str) -> str:
    """A CDI spec for ``nvidia.com/gpu`` in the layout ``nvidia-ctk cdi generate`` writes (CDI 0.5.0:
    ``kind``, ``devices`` ``0``.. and ``all``, top-level ``containerEdits`` with the driver's versioned
    library), standing in for the real one: the bed's GPU files are plain files, so they are given as
    bind mounts (CDI ``deviceNodes`` must be device files), and the driver's library is
    ``/srv/nvidia-driver/libcuda.so.DRIVER`` (per host), mounted at ``/opt/nvidia-driver/``."""
    gpu = [{"hostPath": f"/dev/nvidia{i}", "containerPath": f"/dev/nvidia{i}", "options": ["rw", "bind"]}
           for i in range(n_gpus)]
    lib = f"libcuda.so.{driver}"
    spec = {"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
            "devices": [{"name": str(i), "containerEdits": {"mounts": [gpu[i]]}} for i in range(n_gpus)]
            + [{"name": "all", "containerEdits": {"mounts": gpu}}],
            "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"],
                               "mounts": [{"hostPath": f"/srv/nvidia-driver/{lib}",
                                           "containerPath": f"/opt/nvidia-driver/{lib}",
                                           "options": ["ro", "nosuid", "nodev", "bind"]}]}}
    import yaml

    return "---\n" + yaml.safe_dump(spec, sort_keys=False)


def _container_files(host: Host) -> Tuple[List[List[str]], List[str]]:
    """A container host's podman set-up: its own ``/etc/containers`` (the machine's, plus a
    containers.conf with ``cgroups="disabled"``, low default ulimits and the machine's ``/usr``,
    the venv and its base Python bound read-only into every container, so the image is tiny;
    storage.conf with the ``vfs`` driver), its own ``/var/lib/containers``, and the image tar
    (the stand-in SGLang tree at ``/opt/sglang``, ``/opt/venv`` linking to the repo's venv).
    Returns ``(binds, setup commands)``: the cgroup v1 ``unified`` mount is unmounted in the
    host's mount namespace (podman refuses the hybrid layout) and the tar imported."""
    hd = host.hostdir
    etc = hd / "etc-containers"
    if os.path.isdir("/etc/containers"):
        shutil.copytree("/etc/containers", etc, symlinks=True)
    else:
        etc.mkdir()
    venv = str(Path(VENV_PYTHON).parent.parent)
    base = os.path.dirname(os.path.dirname(os.path.realpath(VENV_PYTHON)))
    vols = ["/usr:/usr:ro", f"{venv}:{venv}:ro"] + ([f"{base}:{base}:ro"] if not base.startswith("/usr/") else [])
    (etc / "containers.conf").write_text(
        "[containers]\ncgroups = \"disabled\"\n"
        "default_ulimits = [\"nofile=1024:1024\", \"nproc=1000:1000\"]\n"
        f"volumes = {json.dumps(vols)}\n"
        "[engine]\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\n")
    (etc / "storage.conf").write_text(
        "[storage]\ndriver = \"vfs\"\ngraphroot = \"/var/lib/containers/storage\"\n"
        "runroot = \"/run/containers/storage\"\n")
    (hd / "var-lib-containers").mkdir()
    import tarfile

    tar_path = hd / "run" / "orchtb" / "image.tar"
    with tarfile.open(tar_path, "w") as tar:
        for d in ("etc", "tmp", "root", "opt", "proc", "sys", "dev", "run", "var", "var/tmp", "moe"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if d in ("tmp", "var/tmp") else 0o755
            tar.addfile(info)
        for name, target in (("bin", "usr/bin"), ("sbin", "usr/sbin"), ("lib", "usr/lib"), ("lib64", "usr/lib64"),
                             ("opt/venv", venv)):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
        tar.add(str(hd / "opt-sglang"), arcname="opt/sglang")
        if host.options["engine"] == "vllm":
            tar.add(str(hd / "srv" / "vllm"), arcname="opt/vllm")
    binds = [[str(etc), "/etc/containers"], [str(hd / "var-lib-containers"), "/var/lib/containers"]]
    cdi_cmds = []
    if host.options["container"].get("cdi"):  # /etc/cdi of its own, and the stand-in driver's library
        (hd / "etc-cdi").mkdir()
        (hd / "etc-cdi" / "nvidia.yaml").write_text(cdi_spec(int(host.options["n_gpus"]), CDI_DRIVER))
        binds.append([str(hd / "etc-cdi"), "/etc/cdi"])
        cdi_cmds.append(f"mkdir -p /srv/nvidia-driver && echo stand-in > /srv/nvidia-driver/libcuda.so.{CDI_DRIVER}")
    if container_runtime(host) == "docker":  # /usr/bin/docker: the stand-in, through hostinit's /usr/bin overlay
        shutil.copy(DOCKER_SHIM, hd / "run" / "orchtb" / "docker_shim.py")
        os.chmod(hd / "run" / "orchtb" / "docker_shim.py", 0o644)
        upper = hd / "usr-bin-upper"
        upper.mkdir()
        (hd / "usr-bin-work").mkdir()
        python = VENV_PYTHON if _everyone_can_run(VENV_PYTHON) else "/usr/bin/python3"
        (upper / "docker").write_text(f"#!/bin/sh\nexec {shlex.quote(python)} /run/orchtb/docker_shim.py \"$@\"\n")
        os.chmod(upper / "docker", 0o755)
        for other in ("/usr/local/bin/docker", "/usr/local/sbin/docker"):  # a machine's own docker client, first
            if os.path.isfile(other):                                      # on PATH, is the stand-in in the host
                binds.append([str(upper / "docker"), other])
    cmds = ["if grep -q ' /sys/fs/cgroup/unified ' /proc/self/mounts; then umount /sys/fs/cgroup/unified; fi",
            # `ip netns exec` gives the host a fresh sysfs with an empty /sys/fs/cgroup, whose type crun refuses
            "grep -q ' /sys/fs/cgroup ' /proc/self/mounts || mount -t tmpfs -o mode=755 orchtb-cgroup /sys/fs/cgroup",
            f"podman import /run/orchtb/image.tar {CONTAINER_IMAGE} >/dev/null"] + cdi_cmds
    if host.options["engine"] == "vllm":  # vLLM's image (docker/Dockerfile, vllm-openai): ENTRYPOINT vllm serve
        change = [f"ENV=PATH=/opt/vllm/{vllm_tree.SCRIPT.rsplit('/', 1)[0]}:/opt/venv/bin:/usr/local/bin:/usr/bin:/bin",
                  "ENV=PYTHONPATH=/opt/vllm", "ENV=ORCH_STANDIN_VLLM_SRC=/opt/vllm",
                  'ENTRYPOINT=["vllm","serve"]']  # no spaces: podman splits a change on them
        cmds.append("podman import " + " ".join(f"--change {shlex.quote(c)}" for c in change)
                    + f" /run/orchtb/image.tar {vllm_image(host)} >/dev/null")
    return binds, cmds


#: where a user unit's file goes in its user's home (systemd.unit(5): ``~/.config/systemd/user``)
USER_UNIT_DIR = ".config/systemd/user"


def user_unit_binds(hostdir: Path) -> List[List[str]]:
    """Binds that let LOGIN_USER run the bed's Python inside a user-unit host: a per-host ``/root``
    (``hostdir/root-home``, mode 0755, so the user may pass through it), first, then the venv
    interpreter's own installation bound back at its path when it lives under ``/root`` (a pyenv
    Python: this machine's ``/root`` is 0700, so the user could not run the units' interpreter or
    the host's journalctl). hostinit opens every source before it binds anything, so the
    installation is found although ``/root`` is covered by then."""
    home = hostdir / "root-home"
    home.mkdir(mode=0o755, exist_ok=True)
    os.chmod(home, 0o755)
    binds = [[str(home), "/root"]]
    prefix = os.path.dirname(os.path.dirname(os.path.realpath(VENV_PYTHON)))
    if prefix == "/root" or prefix.startswith("/root/"):
        binds.append([prefix, prefix])
    return binds


def _unit_text(host: Host, extra: Optional[Dict[str, Any]] = None) -> str:
    """The unit file of the host's SGLang unit, or (``extra``: an entry of ``more_units``) of a
    further unit on the same host. A user unit (``user_unit``) runs as LOGIN_USER in its home."""
    o = host.options
    user = bool(o["user_unit"]) and not extra
    env = {"PYTHONPATH": "/opt/sglang", "ORCH_STANDIN_GPU_NAME": o["gpu_name"],
           "ORCH_STANDIN_WARMUP_S": str(o["warmup_s"]), "PYTHONUNBUFFERED": "1",
           "HOME": LOGIN_HOME if user else "/root",
           "ORCH_STANDIN_GPU_CAPABILITY": str(o["gpu_capability"])}
    if user:  # the stand-in's own state (leak markers) where its user may write
        env["ORCH_STANDIN_STATE_DIR"] = f"{LOGIN_HOME}/.local/state/sglang-standin"
    if o["moe_config_dir"]:
        env["VLLM_TUNED_CONFIG_FOLDER" if o["engine"] == "vllm" else "SGLANG_MOE_CONFIG_DIR"] = o["moe_config_dir"]
    if o["gpu_exclusive"]:
        env["ORCH_STANDIN_GPU_EXCLUSIVE"] = "1"
    if o["flashinfer_version"]:  # FlashInfer's autotune cache stays inside the host (not this machine's ~/.cache)
        env["SGLANG_CACHE_DIR"] = "/srv/sglang-cache"
    unit = (extra or {}).get("unit") or o["unit"]
    port = int((extra or {}).get("port") or o["port"])
    gpus = list((extra or {}).get("gpus") or o["gpus"] or range(max(1, int(o["tp"]))))
    cvd = _cvd_value(host, gpus, (extra or {}).get("cvd") if extra else o["cvd"])
    if extra or o["gpus"] is not None:  # the stand-in opens exactly these device files
        env["ORCH_STANDIN_NVIDIA_DEV"] = ",".join(f"/dev/nvidia{i}" for i in gpus)
    if cvd:
        env["CUDA_VISIBLE_DEVICES"] = cvd
    env.update({k: str(v) for k, v in ((extra.get("env") or {}) if extra else o["env"]).items()})
    bind = o["bind_host"] if not extra else "0.0.0.0"
    if extra or o["launch_args"] is None:
        flags = ["--model-path", "/models/tiny-moe", "--tp", str(len(gpus) if extra else o["tp"]),
                 "--port", str(port)]
        if bind is not None:
            flags += ["--host", host.address if bind == "address" else bind]
    else:
        flags = [str(a) for a in o["launch_args"]]
    if o["backend"] and not extra:
        flags += ["--moe-runner-backend", o["backend"]]
    if not extra:
        flags += [str(a) for a in o["extra_args"]]
    args = [VENV_PYTHON, "-m", "sglang.launch_server"] + flags
    if o["engine"] == "vllm" and not extra:
        env["ORCH_STANDIN_VLLM_SRC"] = VLLM_TREE
        # the tree on the path, after any folder the host's ``env`` puts first (a fault hook's)
        env["PYTHONPATH"] = str(o["env"].get("PYTHONPATH") or VLLM_TREE)
        flags = _vllm_flags(host)
        args = ([f"{VLLM_TREE}/bin/vllm", "serve"] if o["vllm_launch"] == "serve"
                else [VENV_PYTHON, "-m", "vllm.entrypoints.openai.api_server"]) + flags
    exec_start = " ".join(shlex.quote(a) for a in args)
    if o["exec_start"] and not extra:
        exec_start = o["exec_start"].format(python=shlex.quote(VENV_PYTHON), sglang=SGLANG_SCRIPT, conda=CONDA,
                                            args=" ".join(shlex.quote(a) for a in flags))
    if o["container"] and not extra:
        args, env = _container_exec(host, args, env), {}
        exec_start = " ".join(shlex.quote(a) for a in args)
        if container_runtime(host) == "docker":  # as docker units are written (a stale container's name freed)
            o = dict(o, unit_lines=[f"ExecStartPre=-/usr/bin/docker rm -f {container_name(host)}", *o["unit_lines"]])
    lines = [
        "[Unit]",
        f"Description={'vLLM' if o['engine'] == 'vllm' and not extra else 'SGLang'} server (orch test bed "
        f"stand-in) on {host.name}",
        "After=network.target",
        "",
        "[Service]",
        "Type=simple",
    ]
    lines += [f'Environment="{k}={v}"' for k, v in env.items()]
    lines += [f"EnvironmentFile={f}" for f in ((extra or {}).get("env_files", []) if extra else o["env_files"])]
    service = [
        "ExecStart=" + exec_start,
        f"WorkingDirectory={LOGIN_HOME if user else '/root'}",
        "KillMode=control-group",
        # docker-systemctl-replacement keeps its state beside /run only when the caller may write
        # /run (root); fix the path so a non-root `systemctl show` (LOGIN_USER) reads the same state
        # (a user unit's every caller is its user: the replacement's --user state folder serves)
        *([] if user else [f"StatusFile=/run/{unit}.service.status"]),
        f"TimeoutStopSec={o['timeout_stop_s']}",
        "Restart=no",
    ]
    more = [] if extra else [str(x) for x in [*o["unit_lines"], *(o.get("service_lines") or [])]]
    replaced = {m.split("=", 1)[0] for m in more if m.split("=", 1)[0] in ("Type", "KillMode", "Restart",
                                                                           "TimeoutStopSec", "WorkingDirectory")}
    if "Type" in replaced:
        lines = [x for x in lines if not x.startswith("Type=")]
    lines += [x for x in service if x.split("=", 1)[0] not in replaced] + more
    lines += [
        "",
        "[Install]",
        "WantedBy=default.target" if user else "WantedBy=multi-user.target",
        "",
    ]
    return "\n".join(lines)


class TestBed:
    """N hosts (see module docstring). Use as a context manager; everything is torn down on
    exit, also after a failed test.

    ``host_options``: ``{host name or index: {option: value}}`` with the keys of
    ``HOST_OPTION_DEFAULTS``; ``workdir``: folder for keys, per-host trees and logs (a temporary
    folder under /tmp by default, removed at teardown); ``persistent``: keep the hosts after this
    process exits (for ``python -m tests.testbed up``).
    Attributes: ``hosts`` (list of Host), ``key_path`` (private key accepted by every host as
    root and as ``login_user``), ``known_hosts_path`` (OpenSSH known_hosts listing every host's
    key), ``bed_id``, ``login_user`` (``orchop``: non-root, sudo with ``become_password``).
    """

    __test__ = False  # not a pytest test class

    def __init__(self, n_hosts: int = 2, host_options: Optional[Dict[Any, Dict[str, Any]]] = None,
                 workdir: Optional[os.PathLike] = None, persistent: bool = False, names: Optional[List[str]] = None):
        if os.geteuid() != 0:
            raise TestBedError("the test bed needs root (network namespaces, mounts)")
        self.n_hosts = n_hosts
        self.host_options = host_options or {}
        self.persistent = persistent
        self.bed_id = secrets.token_hex(2)
        self.owns_workdir = workdir is None
        self.workdir = Path(workdir or f"/tmp/orchtb-{self.bed_id}").resolve()
        self.names = names or [f"gpu-{chr(ord('a') + i)}" for i in range(n_hosts)]
        self.hosts: List[Host] = []
        self.key_path = self.workdir / "id_ed25519"
        self.known_hosts_path = self.workdir / "known_hosts"
        self.state_dir = STATE_ROOT / self.bed_id
        self.login_user = LOGIN_USER
        self.become_password = ""  # set by create() (ensure_login_user); never written into a host
        self._up = False

    # --- lifecycle ----------------------------------------------------------------------
    def __enter__(self) -> "TestBed":
        try:
            self.create()
        except BaseException:
            self.destroy()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.destroy()

    def _options_for(self, i: int, name: str) -> Dict[str, Any]:
        opts = json.loads(json.dumps(HOST_OPTION_DEFAULTS))
        for key in (i, name, str(i)):
            if key in self.host_options:
                unknown = set(self.host_options[key]) - set(HOST_OPTION_DEFAULTS)
                if unknown:
                    raise TestBedError(f"unknown host option(s) {sorted(unknown)}")
                opts.update(self.host_options[key])
        if opts["sglang_release"]:
            opts["layout"] = standin_tree.layout_of(opts["sglang_release"])
        if opts["container"] and opts["container"].get("moe_mount") and not opts["moe_config_dir"]:
            opts["moe_config_dir"] = "/srv/moe"  # the host folder bound at /moe in the container
        if opts["container"]:
            opts["strays"] = False  # a container's GPU holders are the runtime's to end, not orch's reap
        return opts

    def _save_state(self) -> None:
        state = {
            "bed_id": self.bed_id, "persistent": self.persistent, "owner_pid": os.getpid(),
            "owner_start": _proc_start_time(os.getpid()), "workdir": str(self.workdir),
            "owns_workdir": self.owns_workdir, "key_path": str(self.key_path),
            "known_hosts_path": str(self.known_hosts_path), "created": time.time(),
            "extra": getattr(self, "extra_state", {}),
            "hosts": [{"name": h.name, "ns": h.ns, "veth": h.veth, "address": h.address, "init_pid": h.init_pid,
                       "init_start": h.init_start, "options": h.options} for h in self.hosts],
        }
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_dir / "state.json.tmp"
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(self.state_dir / "state.json")

    def create(self) -> None:
        """Create the namespaces, trees and processes of every host and wait until each one's
        sshd answers and its unit was started. Raises TestBedError."""
        cleanup_stale()
        if shutil.which("visudo") is None or not os.path.exists("/usr/bin/sudo"):
            raise TestBedError("sudo is not installed (run tests/testbed/setup.sh)")
        self._save_state()  # recorded before the user is made: remove_machine_setup() then keeps it
        self.become_password = ensure_login_user()
        self.workdir.mkdir(parents=True, exist_ok=True)
        triton_version = os.environ.get("ORCH_STANDIN_TRITON_VERSION") or _run(
            [VENV_PYTHON, "-c", "import triton; print(triton.__version__)"]).stdout.strip()
        for stale in (self.key_path, Path(f"{self.key_path}.pub"), self.known_hosts_path, self.host_ca_path,
                      Path(f"{self.host_ca_path}.pub")):
            stale.unlink(missing_ok=True)
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"orch-testbed-{self.bed_id}", "-f",
              str(self.key_path)])
        with _state_lock():
            used = _used_subnets()
            free = [k for k in range(1, 255) if k not in used]
            if len(free) < len(self.names):
                raise TestBedError("no free 10.213.x.0/24 subnets left")
            for i, name in enumerate(self.names):
                k = free[i]
                host = Host(name=name, address=f"{SUBNET_PREFIX}.{k}.2", port=22, user="root",
                            ns=f"{NS_PREFIX}{self.bed_id}-{name}", veth=f"otb{self.bed_id}{i:02d}",
                            hostdir=self.workdir / name, options=self._options_for(i, name),
                            triton_version=self._options_for(i, name)["env"].get(
                                "ORCH_STANDIN_TRITON_VERSION", triton_version))
                self.hosts.append(host)
            self._save_state()
            for i, host in enumerate(self.hosts):
                self._make_network(host, i)
            self._make_jump_links()
            self._make_cluster_links()
        for host in self.hosts:
            self._make_files(host)
        for host in self.hosts:
            self._start_host(host)
        self._save_state()
        for host in self.hosts:
            self._wait_ssh(host)
        self.known_hosts_path.write_text("".join(
            f"{h.address} {(h.hostdir / 'ssh_host_ed25519_key.pub').read_text().split()[0]} "
            f"{(h.hostdir / 'ssh_host_ed25519_key.pub').read_text().split()[1]}\n" for h in self.hosts))
        self._up = True

    def _make_network(self, host: Host, i: int) -> None:
        peer = f"otp{self.bed_id}{i:02d}"
        gw = host.address.rsplit(".", 1)[0] + ".1"
        _run(["ip", "netns", "add", host.ns])
        _run(["ip", "link", "add", host.veth, "type", "veth", "peer", "name", peer])
        _run(["ip", "link", "set", peer, "netns", host.ns])
        _run(["ip", "-n", host.ns, "link", "set", peer, "name", "eth0"])
        _run(["ip", "addr", "add", f"{gw}/24", "dev", host.veth])
        _run(["ip", "link", "set", host.veth, "up"])
        _run(["ip", "-n", host.ns, "addr", "add", f"{host.address}/24", "dev", "eth0"])
        _run(["ip", "-n", host.ns, "link", "set", "eth0", "up"])
        _run(["ip", "-n", host.ns, "link", "set", "lo", "up"])
        # no default route: a host reaches only its own /24 (the root namespace end), nothing else

    def _make_jump_links(self) -> None:
        """For each host with ``ssh_only_via: BASTION``: a veth pair straight between the two
        namespaces (never in the root namespace), ``10.213.255.4j+1`` on the bastion's end and
        ``.4j+2`` on the host's (10.213.255.0/24 is never a host subnet), and a route in the bastion
        to the host's address over it. The host's sshd then admits logins only from the bastion's
        link address (``AllowUsers user@ADDR``), so the controller's direct path is refused."""
        jumped = [h for h in self.hosts if h.options["ssh_only_via"]]
        for j, host in enumerate(jumped):
            via = host.options["ssh_only_via"]
            try:
                bastion = self.host(via)
            except KeyError:
                raise TestBedError(f"[{host.name}] ssh_only_via: no bed host {via!r}") from None
            if bastion is host or bastion.options["ssh_only_via"]:
                raise TestBedError(f"[{host.name}] ssh_only_via {via!r}: the bastion must be another, directly "
                                   "reachable host")
            near, far = f"otb{self.bed_id}{50 + j:02d}", f"otp{self.bed_id}{50 + j:02d}"
            host.link_peer, host.link_address = f"{SUBNET_PREFIX}.255.{4 * j + 1}", f"{SUBNET_PREFIX}.255.{4 * j + 2}"
            _veth_pair((bastion.ns, near, host.link_peer), (host.ns, far, host.link_address))
            _run(["ip", "-n", bastion.ns, "route", "add", f"{host.address}/32", "via", host.link_address])

    def _make_cluster_links(self) -> None:
        """For each host with ``cluster_with: PEER``: a veth pair straight between the two namespaces
        (``10.213.254.4j+1`` on the peer's end, ``.4j+2`` on the host's; 10.213.254.0/24 is never a
        host subnet), and in each namespace a route to the other's address over it, as the hosts of a
        multi-node server reach each other on a fleet's own network (the rest of the bed stays
        unreachable). Each host's /etc/hosts then names the other (``_make_files``)."""
        linked = [h for h in self.hosts if h.options["cluster_with"]]
        for j, host in enumerate(linked):
            name = host.options["cluster_with"]
            try:
                peer = self.host(name)
            except KeyError:
                raise TestBedError(f"[{host.name}] cluster_with: no bed host {name!r}") from None
            if peer is host:
                raise TestBedError(f"[{host.name}] cluster_with {name!r}: a host cannot be linked to itself")
            near, far = f"otc{self.bed_id}{60 + j:02d}", f"otq{self.bed_id}{60 + j:02d}"
            peer_end, host_end = f"{SUBNET_PREFIX}.254.{4 * j + 1}", f"{SUBNET_PREFIX}.254.{4 * j + 2}"
            _veth_pair((peer.ns, near, peer_end), (host.ns, far, host_end))
            _run(["ip", "-n", peer.ns, "route", "add", f"{host.address}/32", "via", host_end])
            _run(["ip", "-n", host.ns, "route", "add", f"{peer.address}/32", "via", peer_end])
            host.cluster_peers.append(peer)
            peer.cluster_peers.append(host)

    @property
    def host_ca_path(self) -> Path:
        """Private key of the bed's SSH host CA (made by the first host with ``host_certificate``)."""
        return self.workdir / "host_ca"

    def host_ca_public(self) -> str:
        """``TYPE BASE64`` of the bed's host CA (for an ``@cert-authority`` known_hosts line)."""
        return " ".join(Path(f"{self.host_ca_path}.pub").read_text().split()[:2])

    def _sign_host_key(self, host: Host) -> None:
        """Sign the host's key with the bed's host CA (``ssh-keygen -s -h``, principals: its
        address and name, valid from 5 minutes ago for a day): a real OpenSSH host certificate."""
        if not self.host_ca_path.exists():
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"orch-testbed-{self.bed_id}-host-ca",
                  "-f", str(self.host_ca_path)])
        hd = host.hostdir
        _run(["ssh-keygen", "-q", "-s", str(self.host_ca_path), "-I", f"{host.name}-host", "-h",
              "-n", f"{host.address},{host.name}", "-V", "-5m:+1d", str(hd / "ssh_host_ed25519_key.pub")])
        shutil.copy(hd / "ssh_host_ed25519_key-cert.pub", hd / "run" / "orchtb" / "ssh_host_ed25519_key-cert.pub")

    def _make_files(self, host: Host) -> None:
        o = host.options
        hd = host.hostdir
        if hd.exists():
            shutil.rmtree(hd)
        for _, local in _host_mounts(hd):
            Path(local).mkdir(parents=True, exist_ok=True)
        os.chmod(hd / "tmp", 0o1777)
        os.chmod(hd / "root-ssh", 0o700)
        (hd / "run" / "orchtb").mkdir()
        (hd / "var-log" / "journal").mkdir()
        (hd / "var-lib-orch").chmod(0o755)
        # stand-in SGLang tree for this host
        standin_tree.make_tree(hd / "opt-sglang", o["layout"], o["sglang_release"], o["flashinfer_version"])
        _make_launchers(hd / "opt-sglang")
        if o["engine"] == "vllm":  # the stand-in vLLM tree (its console script runs the venv python)
            vllm_tree.make_tree(hd / "srv" / "vllm", o["vllm_release"], VENV_PYTHON)
        # model
        (hd / "models" / "tiny-moe").mkdir(parents=True)
        (hd / "models" / "tiny-moe" / "config.json").write_text(
            json.dumps(o["model_config"] or TINY_MOE_CONFIG, indent=2) + "\n")
        # fake GPU device files
        (hd / "dev").mkdir()
        nvidia = [f"nvidia{i}" for i in range(int(o["n_gpus"]))] + ["nvidiactl"]
        for n in nvidia:
            (hd / "dev" / n).write_bytes(b"")
            os.chmod(hd / "dev" / n, 0o666)
        # SSH: authorized key, host key, sshd config (all read by sshd inside the host)
        shutil.copy(f"{self.key_path}.pub", hd / "root-ssh" / "authorized_keys")
        os.chmod(hd / "root-ssh" / "authorized_keys", 0o600)
        # the non-root login: its own home on this host (same key), and its sudo rights here only
        import pwd

        pw = pwd.getpwnam(LOGIN_USER)
        home = hd / "home-login"
        (home / ".ssh").mkdir(mode=0o700)
        shutil.copy(f"{self.key_path}.pub", home / ".ssh" / "authorized_keys")
        os.chmod(home / ".ssh" / "authorized_keys", 0o600)
        os.chmod(home, 0o700)
        for p in (home, home / ".ssh", home / ".ssh" / "authorized_keys"):
            os.chown(p, pw.pw_uid, pw.pw_gid)
        os.chmod(hd / "etc-sudoers.d", 0o755)
        dropin = hd / "etc-sudoers.d" / LOGIN_USER
        dropin.write_text(sudoers_text())
        os.chmod(dropin, 0o440)
        check = _run(["visudo", "-c", "-q", "-f", str(dropin)], check=False)
        if check.returncode != 0:
            raise TestBedError(f"sudoers drop-in {dropin} is invalid: {check.stdout}{check.stderr}")
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{host.name}-hostkey", "-f",
              str(hd / "ssh_host_ed25519_key")])
        shutil.copy(hd / "ssh_host_ed25519_key", hd / "run" / "orchtb" / "ssh_host_ed25519_key")
        os.chmod(hd / "run" / "orchtb" / "ssh_host_ed25519_key", 0o600)
        if o["host_certificate"]:
            self._sign_host_key(host)
        (hd / "run" / "orchtb" / "sshd_config").write_text("\n".join([
            "Port 22",
            "ListenAddress 0.0.0.0",
            "HostKey /run/orchtb/ssh_host_ed25519_key",
            "PidFile /run/sshd.pid",
            "PermitRootLogin prohibit-password",
            (f"AllowUsers root@{host.link_peer} {LOGIN_USER}@{host.link_peer}" if host.link_peer
             else f"AllowUsers root {LOGIN_USER}"),
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "AuthorizedKeysFile .ssh/authorized_keys",
            *(["Subsystem sftp /usr/lib/openssh/sftp-server"] if o["sftp"] else []),
            *[f"Port {int(p)}" for p in o["sshd_extra_ports"]],
            *(["HostCertificate /run/orchtb/ssh_host_ed25519_key-cert.pub"] if o["host_certificate"] else []),
            "PrintMotd no",
            "UseDNS no",
            f"MaxStartups {_max_startups(o['sshd_max_startups'])}",
            f"MaxSessions {int(o['sshd_max_sessions'])}",
            "ClientAliveInterval 30",
            "LogLevel INFO",
            "",
        ]))
        # systemctl / journalctl of the host
        (hd / "bin").mkdir()
        (hd / "bin" / "systemctl").write_text(_systemctl_wrapper(hd / "run" / "orchtb"))
        if o["systemd_run"]:
            # the systemd-run stand-in (tests/testbed/systemd_run.py), found first on PATH
            shutil.copy(SYSTEMD_RUN, hd / "run" / "orchtb" / "systemd_run.py")
            os.chmod(hd / "run" / "orchtb" / "systemd_run.py", 0o644)
            (hd / "usr-local-sbin").mkdir(exist_ok=True)
            (hd / "usr-local-sbin" / "systemd-run").write_text(
                f"#!/bin/sh\nexec {shlex.quote(_shim_python())} /run/orchtb/systemd_run.py \"$@\"\n")
            os.chmod(hd / "usr-local-sbin" / "systemd-run", 0o755)
        (hd / "bin" / "journalctl").write_text(
            f"#!/bin/sh\nORCHTB_JOURNALCTL_VERSION={int(o['journalctl_version'])} "
            f"exec {shlex.quote(VENV_PYTHON)} {shlex.quote(JOURNAL_SHIM)} \"$@\"\n")
        for n in ("systemctl", "journalctl"):
            os.chmod(hd / "bin" / n, 0o755)
        # name resolution stays inside the host: no DNS server is ever asked
        (hd / "etc").mkdir()
        (hd / "etc" / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
        (hd / "etc" / "hosts").write_text(f"127.0.0.1 localhost\n{host.address} {host.name}\n"
                                          + "".join(f"{p.address} {p.name}\n" for p in host.cluster_peers))
        # the unit: the system manager's, or (user_unit) LOGIN_USER's own in its home
        if o["user_unit"]:
            folder = home
            for part in USER_UNIT_DIR.split("/"):
                folder = folder / part
                folder.mkdir(exist_ok=True)
                os.chown(folder, pw.pw_uid, pw.pw_gid)
            (folder / f"{o['unit']}.service").write_text(_unit_text(host))
            os.chown(folder / f"{o['unit']}.service", pw.pw_uid, pw.pw_gid)
        else:
            (hd / "etc-systemd-system" / f"{o['unit']}.service").write_text(_unit_text(host))
        fleet_binds = self._make_fleet_files(host)
        # MoE config folder override and pre-installed config files
        setup_cmds = []
        if o["container"]:
            more, cmds = _container_files(host)
            fleet_binds += more
            setup_cmds += cmds
        if o["moe_config_dir"]:
            sub = "" if o["engine"] == "vllm" else "/configs"  # vLLM reads the folder itself
            setup_cmds.append(f"mkdir -p {shlex.quote(o['moe_config_dir'].rstrip('/') + sub)}")
        for name, content in o["config_files"].items():
            target = self._config_target(host, name)
            text = content if isinstance(content, str) else json.dumps(content, indent=4)
            setup_cmds.append(f"mkdir -p {shlex.quote(os.path.dirname(target))} && "
                              f"printf '%s' {shlex.quote(text)} > {shlex.quote(target)}")
        spec = {
            "name": host.name, "hostdir": str(hd), "init_log": str(hd / "init.log"),
            "binds": (user_unit_binds(hd) if o["user_unit"] else [])
                + [[local, inside] for inside, local in _host_mounts(hd)] + [
                [str(hd / "bin" / "systemctl"), "/usr/bin/systemctl"],
                [str(hd / "bin" / "journalctl"), "/usr/bin/journalctl"],
                [str(hd / "etc" / "resolv.conf"), "/etc/resolv.conf"],
                [str(hd / "etc" / "hosts"), "/etc/hosts"]] + fleet_binds
                + _hidden_code_binds(hd, more_mounts=("/root",) if o["user_unit"] else ())
                + ([] if o["user_unit"] else _clean_shell_binds(hd))  # a per-host /root has no start-up files
                + ([[str(hd / "usr-local-sbin"), "/usr/local/sbin"]] if (hd / "usr-local-sbin").is_dir() else []),
            "nvidia": nvidia, "sshd_config": "/run/orchtb/sshd_config", "python": VENV_PYTHON,
            "setup_cmds": setup_cmds, "strays": bool(o["strays"]),
            "usr_bin_overlay": ([str(hd / "usr-bin-upper"), str(hd / "usr-bin-work")]
                                if (hd / "usr-bin-upper").is_dir() else None),
            "start_units": (([] if o["user_unit"] else [o["unit"]]) + [u["unit"] for u in o["more_units"]])
                           if o["start_unit"] else [],
            # a user unit is started by its user's own manager (systemctl --user, as that user)
            "user_units": [o["unit"]] if o["start_unit"] and o["user_unit"] else [],
            "login_user": LOGIN_USER, "login_home": LOGIN_HOME,
            "unit_ports": {o["unit"]: int(o["port"]), **{u["unit"]: int(u["port"]) for u in o["more_units"]}},
            "unit_addresses": {o["unit"]: host.url.split("//", 1)[1].rsplit(":", 1)[0]},
        }
        # /tmp and /run last: binding them must not hide later sources (hostinit also uses O_PATH fds)
        (hd / "spec.json").write_text(json.dumps(spec, indent=1))

    def _make_fleet_files(self, host: Host) -> List[List[str]]:
        """The real-fleet variants of ``host`` (FLEET_OPTION_DEFAULTS): further units, files
        (``/etc/default``, ``/etc/sglang`` get a per-host copy), the fake ``nvidia-smi``, a state
        folder shared with an earlier host. Returns the extra binds ``[source, inside]``."""
        o, hd = host.options, host.hostdir
        binds: List[List[str]] = []
        for extra in o["more_units"]:
            (hd / "etc-systemd-system" / f"{extra['unit']}.service").write_text(_unit_text(host, extra))
        for path, text in o["files"].items():
            if not path.startswith("/"):
                raise TestBedError(f"host option files: {path!r} is not absolute")
            etc = next((d for d in FLEET_ETC_DIRS if path.startswith(d + "/")), None)
            if etc is not None:
                local_dir = hd / ("etc-" + etc.rsplit("/", 1)[1])
                if not local_dir.exists():
                    if os.path.isdir(etc):
                        shutil.copytree(etc, local_dir, symlinks=True)
                    else:
                        local_dir.mkdir(parents=True)
                    binds.append([str(local_dir), etc])
                target = local_dir / os.path.relpath(path, etc)
            else:
                target = host.local_path(path)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        if o["nvidia_smi"]:
            gpus = [{"index": i, "name": o["gpu_name"], "uuid": host.gpu_uuid(i), "compute_cap": str(o["gpu_capability"]),
                     "pci_bus_id": PCI_BUS_IDS[i % len(PCI_BUS_IDS)],
                     "mig": [{"profile": prof, "uuid": gpu_uuid(host.name, i * 100 + k, "MIG")}
                             for k, prof in enumerate(o["mig"].get(i, o["mig"].get(str(i), [])))]}
                    for i in range(int(o["n_gpus"]))]
            (hd / "run" / "orchtb" / "gpus.json").write_text(json.dumps(gpus, indent=1))
        python = VENV_PYTHON if _everyone_can_run(VENV_PYTHON) else "/usr/bin/python3"
        sbin = hd / "usr-local-sbin"  # bound over /usr/local/sbin in the host spec (with systemd-run)
        for opt, src, name in (("nvidia_smi", NVIDIA_SMI, "nvidia-smi"), ("dmesg", DMESG, "dmesg")):
            if not o[opt]:
                continue
            shutil.copy(src, hd / "run" / "orchtb" / os.path.basename(src))
            os.chmod(hd / "run" / "orchtb" / os.path.basename(src), 0o644)
            sbin.mkdir(exist_ok=True)
            (sbin / name).write_text(f"#!/bin/sh\nexec {shlex.quote(python)} /run/orchtb/{os.path.basename(src)} \"$@\"\n")
            os.chmod(sbin / name, 0o755)
        if o["shares_state_with"]:
            other = self.workdir / o["shares_state_with"] / "var-lib-orch"
            if not other.is_dir():
                raise TestBedError(f"shares_state_with: {o['shares_state_with']} is not an earlier host of this bed")
            os.rmdir(hd / "var-lib-orch")
            os.symlink(other, hd / "var-lib-orch")
        return binds

    @staticmethod
    def _config_target(host: Host, name: str) -> str:
        """Where a pre-installed config file goes inside the host: ``name`` with a ``/`` is
        relative to ``config_dir`` (e.g. ``triton_3_1_0/E=...json``), else it goes into
        ``triton_dir`` (the installed Triton's folder)."""
        if "/" in name or host.options["engine"] == "vllm":
            return f"{host.config_dir}/{name}"
        return f"{host.triton_dir}/{name}"

    def _start_host(self, host: Host) -> None:
        rfd, wfd = os.pipe()
        for mp in ("/models", "/opt/sglang", "/var/lib/orch", LOGIN_HOME):
            os.makedirs(mp, exist_ok=True)
        if host.options["container"]:  # mount points of a container host's podman folders
            os.makedirs("/etc/containers", exist_ok=True)
            os.makedirs("/var/lib/containers", exist_ok=True)
            if host.options["container"].get("cdi"):
                os.makedirs("/etc/cdi", exist_ok=True)
        for etc in FLEET_ETC_DIRS:  # mount points of the per-host /etc folders (FLEET_OPTION_DEFAULTS files)
            if any(p.startswith(etc + "/") for p in host.options["files"]):
                os.makedirs(etc, exist_ok=True)
        os.makedirs("/root/.ssh", mode=0o700, exist_ok=True)
        cmd = ["ip", "netns", "exec", host.ns, "unshare", "--mount", "--pid", "--uts", "--fork", "--mount-proc",
               "--propagation", "private", VENV_PYTHON, HOSTINIT, str(host.hostdir / "spec.json"), str(wfd)]
        host._unshare = subprocess.Popen(cmd, pass_fds=[wfd], stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=open(host.hostdir / "unshare.log", "w"),
                                         start_new_session=True)
        os.close(wfd)
        # the init's pid (child of unshare) in our PID namespace, once unshare has forked it
        def init_pid() -> int | None:
            try:
                kids = Path(f"/proc/{host._unshare.pid}/task/{host._unshare.pid}/children").read_text().split()
            except OSError:
                kids = []
            return int(kids[0]) if kids else None

        try:
            host.init_pid = wait_until(init_pid, f"{host.name}'s init", poll=0.02,
                                       alive=lambda: "unshare ended" if host._unshare.poll() is not None else None)
            host.init_start = _proc_start_time(host.init_pid)
        except AssertionError:
            host.init_pid = None
        host._ready_fd = rfd  # type: ignore[attr-defined]
        if not host.init_pid:
            raise TestBedError(f"[{host.name}] host init did not start (see {host.hostdir}/unshare.log)")

    def _wait_ssh(self, host: Host) -> None:
        rfd = host._ready_fd  # type: ignore[attr-defined]
        with os.fdopen(rfd) as f:
            line = f.readline().strip()
        if line != "READY":
            log = (host.hostdir / "init.log").read_text() if (host.hostdir / "init.log").exists() else ""
            raise TestBedError(f"[{host.name}] host init failed: {line or 'no answer'}\n{log[-3000:]}")

        def listening() -> bool:
            with socket.socket() as s:
                s.settimeout(1)
                return s.connect_ex((host.address, 22)) == 0

        try:  # the init said READY once its sshd listened inside: only the route is left to come up
            wait_until(listening, f"sshd at {host.address}:22", poll=0.05)
        except Stalled:
            raise TestBedError(f"[{host.name}] sshd at {host.address}:22 unreachable") from None

    def destroy(self) -> None:
        """Kill every host's processes, delete namespaces and veths, remove state (and the work
        folder if the bed made it). Safe to call twice."""
        for host in self.hosts:
            if host.init_pid and _alive(host.init_pid, host.init_start):
                try:
                    os.kill(host.init_pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if host._unshare is not None:
                try:  # its init was SIGKILLed: unshare ends with it (a hang guard only)
                    host._unshare.wait(timeout=CEILING_S)
                except subprocess.TimeoutExpired:
                    host._unshare.kill()
                    host._unshare.wait()
        for host in self.hosts:
            _delete_ns(host.ns, host.veth)
        with _state_lock():
            shutil.rmtree(self.state_dir, ignore_errors=True)
        if self.owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        self._up = False

    def detach(self) -> None:
        """Leave the hosts running after this process exits (persistent bed): the state then
        names the hosts' PID 1s as what keeps the bed alive."""
        self.persistent = True
        self._save_state()

    # --- helpers for tests ---------------------------------------------------------------
    def host(self, name: str) -> Host:
        """The host called ``name`` (KeyError if none)."""
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)

    def ssh_command(self, host: Host, command: str, user: Optional[str] = None) -> List[str]:
        """argv of an OpenSSH client call running ``command`` on ``host`` as ``user`` (default
        ``host.user``, root) with strict host key checking against ``known_hosts_path``."""
        return ["ssh", "-i", str(self.key_path), "-o", f"UserKnownHostsFile={self.known_hosts_path}",
                "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
                "-o", "GlobalKnownHostsFile=/dev/null", "-p", str(host.port), f"{user or host.user}@{host.address}",
                command]

    def write_inventory(self, path: os.PathLike, group: str = "testbed", **extra_vars: Any) -> Path:
        """Write an Ansible-style YAML inventory of the hosts to ``path`` and return it.

        ``all.children.<group>.hosts.<name>``: ``ansible_host``, ``ansible_user``, ``ansible_port``,
        ``ansible_ssh_private_key_file`` (absolute), ``orch_service`` (the host's unit),
        ``orch_device_name`` (the GPU name the host's stand-in reports: the bed has no CUDA) and
        ``orch_gpu_capability`` (its compute capability, which decides the MoE runner SGLang picks).
        Group ``vars``: the test-bed defaults (names from ``orchestrator.inventory.variables``):
        ``ansible_python_interpreter`` (the venv python that runs the units), ``orch_known_hosts``
        (absolute), ``orch_model_config``, ``orch_triton_interpret: true``, ``orch_tune_space: smoke``,
        ``orch_tune_batch_sizes: [1, 4]``, short timeouts and a small benchmark; ``extra_vars``
        override or add group vars.
        """
        import yaml

        hosts = {}
        for h in self.hosts:
            hosts[h.name] = {"ansible_host": h.address, "ansible_user": h.user, "ansible_port": h.port,
                             "ansible_ssh_private_key_file": str(self.key_path),
                             "orch_service": f"{h.unit}.service", "orch_device_name": h.options["gpu_name"],
                             "orch_gpu_capability": h.options["gpu_capability"]}
            if h.options.get("user_unit"):  # the unit's user logs in; root's work goes through sudo
                hosts[h.name].update(ansible_user=self.login_user, ansible_become=True,
                                     ansible_become_password=self.become_password, orch_systemd_scope="user")
        group_vars = {
            "ansible_python_interpreter": VENV_PYTHON,
            "orch_known_hosts": str(self.known_hosts_path),
            "orch_model_config": "/models/tiny-moe/config.json",
            "orch_triton_interpret": True,
            "orch_tune_space": "smoke",
            "orch_tune_batch_sizes": [1, 4],
            "orch_connect_timeout": 10,
            "orch_stop_timeout": 30,
            "orch_ready_timeout": 60,
            "orch_bench_concurrency": [1, 4],
            "orch_bench_input_len": 32,
            "orch_bench_output_len": 16,
        }
        group_vars.update(extra_vars)
        inv = {"all": {"children": {group: {"vars": group_vars, "hosts": hosts}}}}
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# Written by the orch test bed (bed {self.bed_id}); its hosts live in network namespaces "
                        f"{NS_PREFIX}{self.bed_id}-*.\n"
                        f"# Remove with `python -m tests.testbed down --inventory {path}` (persistent beds).\n"
                        + yaml.safe_dump(inv, sort_keys=False))
        return path


def load_persistent_beds() -> List[Dict[str, Any]]:
    """States of the persistent beds recorded under STATE_ROOT (list of dicts)."""
    beds = []
    if STATE_ROOT.exists():
        for sfile in sorted(STATE_ROOT.glob("*/state.json")):
            try:
                state = json.loads(sfile.read_text())
            except (OSError, ValueError):
                continue
            if state.get("persistent"):
                beds.append(state)
    return beds
