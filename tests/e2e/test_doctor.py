"""End to end: `orch doctor` over real SSH against one test bed with a host per verdict.

One bed of nine hosts (network namespaces, real sshd, real unit files, the stand-in
SGLang 0.5.23 server), set up so that each verdict has a host:

======  ==============  ==========================================================
host    verdict         how it is set up
======  ==============  ==========================================================
gpu-a   tuned           tuned by ``orch tune`` first (files installed, unit restarted, verified)
gpu-b   fallback        the files only in ``configs/triton_3_1_0`` (another Triton)
gpu-c   default         no file anywhere
gpu-d   not-triton      ``--moe-runner-backend flashinfer_cutlass``
gpu-e   restart-needed  valid files installed after the last start, no restart
gpu-f   broken          an invalid up file written after start (it would crash a start)
gpu-g   broken          an unparsable ``configs/triton_foo`` folder (after start), file missing
gpu-h   restart-needed  valid files pre-installed before start, then the up file replaced by
                        another valid one after start
gpu-i   broken          tuned by ``orch tune``, then its up file corrupted: ``--fix`` says rollback
======  ==============  ==========================================================

Every host also has the bed's stray ``sglang::scheduler_TP0`` holding ``/dev/nvidia0``
(an orphan outside the unit) and ``nvidia-persistenced`` (protected). Doctor runs three
times (``--json --fix``, the text table with ``--fix``, and ``--json`` on the two good hosts);
the hosts' SGLang tree, orch state, unit files, ``/tmp`` and unit PIDs are compared
before and after: doctor must change nothing and kill nothing.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml

from tests.e2e.helpers import REPO, inventory, orch, recap

pytestmark = pytest.mark.testbed

UP = "E=8,N=64,device_name=NVIDIA_H200.json"
DOWN = "E=8,N=64,device_name=NVIDIA_H200_down.json"
CFG = {"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1,
             "num_warps": 4, "num_stages": 2},
       "4": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1,
             "num_warps": 4, "num_stages": 3}}
EXPECTED = {"gpu-a": "tuned", "gpu-b": "fallback", "gpu-c": "default", "gpu-d": "not-triton",
            "gpu-e": "restart-needed", "gpu-f": "broken", "gpu-g": "broken", "gpu-h": "restart-needed",
            "gpu-i": "broken"}
HOST_OPTIONS = {
    "gpu-b": {"config_files": {f"triton_3_1_0/{UP}": CFG, f"triton_3_1_0/{DOWN}": CFG}},
    "gpu-d": {"backend": "flashinfer_cutlass"},
    "gpu-h": {"config_files": {UP: CFG, DOWN: CFG}},
}
CFG2 = {"1": dict(CFG["1"], num_warps=8), "4": dict(CFG["4"], num_stages=4)}


def _write(host, path: str, text: str) -> None:
    """Write ``text`` to ``path`` inside the host (nsenter, not SSH), creating the folder."""
    host.sh(f"mkdir -p \"$(dirname {json.dumps(path)})\" && cat > {json.dumps(path)}", input=text)


def _snapshot(host) -> dict:
    """What doctor must not change on a host."""
    return {
        "sglang": host.file_tree_hash("/opt/sglang"),
        "state": host.file_tree_hash("/var/lib/orch"),
        "units": host.file_tree_hash("/etc/systemd/system"),
        "tmp": sorted(p for p in host.sh("ls -A /tmp", check=False).stdout.split() if p.startswith("orch")),
        "dirs": host.sh(f"ls -A {host.config_dir}").stdout.split(),
        "active": host.unit_state(),
        "pid": host.sh(f"systemctl show -p MainPID {host.unit}", check=False).stdout.strip(),
    }


def _table_rows(text: str) -> dict[str, list[str]]:
    """``{host: [cells of the row's first line]}`` from the rich table doctor prints."""
    rows = {}
    for line in text.splitlines():
        m = re.match(r"^│ (gpu-[a-z]) +│", line)
        if m:
            rows[m.group(1)] = [c.strip() for c in line.strip().strip("│").split("│")]
    return rows


@pytest.fixture(scope="module")
def doctored(tmp_path_factory):
    """The bed, set up per verdict, and the results of the three doctor runs."""
    from tests.conftest import _require_testbed

    _require_testbed()
    from tests.testbed.bed import TestBed

    tmp = tmp_path_factory.mktemp("doctor")
    bed = TestBed(n_hosts=len(EXPECTED), host_options=HOST_OPTIONS, workdir=tmp / "bed")
    bed.__enter__()
    try:
        assert [h.name for h in bed.hosts] == list(EXPECTED)
        for h in bed.hosts:
            h.wait_http("/health")
        e, f, g = bed.host("gpu-e"), bed.host("gpu-f"), bed.host("gpu-g")
        inv = inventory(bed, tmp / "hosts.yaml")
        state = tmp / "state"
        tune = orch("tune", str(inv), "--service", "sglang-qwen", "--limit", "gpu-a,gpu-i", "--json", state_dir=state)
        assert tune.returncode == 0, tune.stderr[-6000:]
        tune_id = recap(tune)["run_id"]
        i = bed.host("gpu-i")
        _write(i, f"{i.triton_dir}/{UP}", json.dumps({"1": CFG["1"], "triton_version": "3.9.0"}))
        # after the start: what the running servers have not seen
        for name in (UP, DOWN):
            _write(e, f"{e.triton_dir}/{name}", json.dumps(CFG))
        _write(f, f"{f.triton_dir}/{UP}", "{not json")
        g.sh(f"mkdir -p {g.config_dir}/triton_foo")
        h = bed.host("gpu-h")
        # mtimes have 1 s resolution: replace the file once the server has run for 3 s
        h.sh(f"for i in $(seq 300); do p=$(systemctl show -p MainPID {h.unit} | cut -d= -f2); "
             "[ \"$(ps -o etimes= -p \"$p\" | tr -d ' ')\" -ge 3 ] 2>/dev/null && exit 0; sleep 0.1; done; exit 1")
        _write(h, f"{h.triton_dir}/{UP}", json.dumps(CFG2))
        before = {h.name: _snapshot(h) for h in bed.hosts}
        holders = {h.name: h.pids_holding("/dev/nvidia0") for h in bed.hosts}
        full = orch("doctor", str(inv), "--service", "sglang-qwen", "--json", "--fix", state_dir=state)
        text = orch("doctor", str(inv), "--service", "sglang-qwen", "--fix", state_dir=state, env={"COLUMNS": "250"})
        narrow = orch("doctor", str(inv), "--service", "sglang-qwen", "--fix", state_dir=state,
                      env={"COLUMNS": "100"})
        good = orch("doctor", str(inv), "--service", "sglang-qwen", "--json", "--limit", "gpu-a,gpu-d",
                    state_dir=state)
        print(narrow.stdout)  # the example in docs/doctor.md (pytest -s)
        after = {h.name: _snapshot(h) for h in bed.hosts}
        yield {"bed": bed, "inv": inv, "before": before, "after": after, "holders": holders,
               "tune_id": tune_id, "full": full, "rows": recap(full), "text": text, "narrow": narrow, "good": good}
    finally:
        bed.destroy()


def test_every_host_gets_its_verdict(doctored):
    rows = doctored["rows"]
    assert doctored["full"].returncode == 1, doctored["full"].stderr[-4000:]
    assert {h: r["verdict"] for h, r in rows.items()} == EXPECTED, {h: r.get("why") for h, r in rows.items()}
    for h, r in rows.items():
        # what the issue asks every row to say
        assert r["device_name"] == "NVIDIA_H200" and r["sglang_version"] == "0.5.23"
        assert r["triton_version"] and r["configs_root"].endswith("/triton_utils/configs")
        assert (r["E"], r["N"], r["tp"], r["ep"]) == (8, 64, 1, 1)
        assert r["file_names"] == {"up": UP, "down": DOWN}


def test_tuned_row(doctored):
    h, r = doctored["bed"].host("gpu-a"), doctored["rows"]["gpu-a"]
    up, down = f"{h.triton_dir}/{UP}", f"{h.triton_dir}/{DOWN}"
    assert r["files"]["up"]["in_installed_folder"] and r["files"]["down"]["in_installed_folder"]
    assert (r["files"]["up"]["sglang_would_load"], r["files"]["down"]["sglang_would_load"]) == (up, down)
    assert r["files"]["up"]["error"] is None and r["files"]["down"]["error"] is None
    # doctor's reading of the last start agrees with the unit's own log
    assert r["log"]["loaded"] == [up, down] and not r["log"]["suboptimal"]
    log = h.unit_log().rsplit("server_args=", 1)[1]  # the last start (after orch tune's restart)
    assert f"Using MoE kernel config from {up}." in log and f"Using MoE kernel config from {down}." in log
    assert r["fix"] is None


def test_fallback_row(doctored):
    h, r = doctored["bed"].host("gpu-b"), doctored["rows"]["gpu-b"]
    for role, name in (("up", UP), ("down", DOWN)):
        f = r["files"][role]
        assert not f["in_installed_folder"] and f["other_folders"] == ["triton_3_1_0"]
        assert f["sglang_would_load"] == f"{h.config_dir}/triton_3_1_0/{name}"
    assert r["log"]["fallback"] and r["log"]["suboptimal"] and not r["log"]["loaded"]
    assert "Fallback to triton version 3.1.0" in h.unit_log()
    assert "triton_3_1_0" in r["why"]
    assert r["fix"] == f"orch tune {doctored['inv']} --service sglang-qwen --limit gpu-b"


def test_default_row(doctored):
    h, r = doctored["bed"].host("gpu-c"), doctored["rows"]["gpu-c"]
    for role in ("up", "down"):
        f = r["files"][role]
        assert not f["in_installed_folder"] and f["other_folders"] == [] and f["sglang_would_load"] is None
    # 0.5.23 words the missing down file with the default line too: the down GEMM reuses the up (default) table
    assert r["log"]["default"] == [f"{h.triton_dir}/{UP}"] and r["log"]["down_missing"] == [f"{h.triton_dir}/{DOWN}"]
    assert "Using default MoE kernel config" in h.unit_log()
    assert r["fix"] == f"orch tune {doctored['inv']} --service sglang-qwen --limit gpu-c"


def test_not_triton_row(doctored):
    r = doctored["rows"]["gpu-d"]
    assert r["backend"] == "flashinfer_cutlass"
    # says the Triton files are not used, what is used instead, and that tune changes nothing
    assert "Triton MoE config files are not used" in r["why"]
    assert "FlashInfer autotune is off: FlashInfer is not installed" in r["why"] and r["autotune"]["enabled"] is False
    assert "orch tune would change nothing" in r["why"]
    assert r["log"] is not None and not r["log"]["loaded"] and not r["log"]["default"]
    assert r["fix"] is None


def test_restart_needed_row(doctored):
    h, r = doctored["bed"].host("gpu-e"), doctored["rows"]["gpu-e"]
    assert r["files"]["up"]["in_installed_folder"] and r["files"]["down"]["in_installed_folder"]
    # the running server started before the files existed: it logged the default config
    assert r["log"]["default"] == [f"{h.triton_dir}/{UP}"] and not r["log"]["loaded"]
    assert r["log"]["down_missing"] == [f"{h.triton_dir}/{DOWN}"]
    assert "disk say tuned" in r["why"] and "logged default" in r["why"]
    assert r["fix"].startswith("ssh gpu-e systemctl restart sglang-qwen")

    # same names as the last start loaded, but the up file was replaced afterwards
    h, r = doctored["bed"].host("gpu-h"), doctored["rows"]["gpu-h"]
    assert r["log"]["loaded"] == [f"{h.triton_dir}/{UP}", f"{h.triton_dir}/{DOWN}"]
    assert "changed after the last start" in r["why"] and UP in r["why"] and DOWN not in r["why"]
    assert r["fix"].startswith("ssh gpu-h systemctl restart sglang-qwen")


def test_broken_rows(doctored):
    f, rf = doctored["bed"].host("gpu-f"), doctored["rows"]["gpu-f"]
    assert rf["files"]["up"]["in_installed_folder"]
    assert rf["files"]["up"]["error"].startswith("not JSON"), rf["files"]["up"]
    assert rf["files"]["up"]["sglang_would_load"] == f"{f.triton_dir}/{UP}"
    assert f"{f.triton_dir.rsplit('/', 1)[1]}/{UP} is invalid" in rf["why"]
    assert rf["installed_by_run"] is None  # not written by orch: tune replaces it, rollback could not
    assert rf["fix"].startswith(f"orch tune {doctored['inv']} --service sglang-qwen --limit gpu-f")
    assert f.unit_state() == "active"  # doctor did not restart it into the crash

    g, rg = doctored["bed"].host("gpu-g"), doctored["rows"]["gpu-g"]
    assert not rg["files"]["up"]["in_installed_folder"]
    assert "triton_foo" in rg["files"]["up"]["fallback_error"] and "ValueError" in rg["files"]["up"]["fallback_error"]
    assert "triton_foo" in rg["why"]
    assert rg["fix"].startswith(f"orch tune {doctored['inv']} --service sglang-qwen --limit gpu-g")
    assert "unparsable" in rg["fix"]

    # written by an orch run, then corrupted: doctor names the run, --fix rolls it back
    i, ri = doctored["bed"].host("gpu-i"), doctored["rows"]["gpu-i"]
    assert "triton_version" in ri["files"]["up"]["error"] and ri["files"]["down"]["error"] is None
    assert ri["installed_by_run"] == doctored["tune_id"]
    assert ri["fix"].startswith(f"orch rollback {doctored['inv']} --service sglang-qwen --limit gpu-i "
                                f"--to {doctored['tune_id']}")
    assert i.unit_state() == "active"


def test_orphans_listed_not_killed(doctored):
    bed, rows = doctored["bed"], doctored["rows"]
    for h in bed.hosts:
        held = doctored["holders"][h.name]
        strays = [p for p, c in held if "sglang::scheduler_TP0" in c and "holder.py" in c]
        persist = [p for p, c in held if "nvidia-persistenced" in c]
        # orch tune reaped the stray on the hosts it tuned; the others still have theirs
        assert len(strays) == (0 if h.name in ("gpu-a", "gpu-i") else 1) and persist, (h.name, held)
        orphans = {o["pid"] for o in rows[h.name]["orphans"]}
        main_pid = int(doctored["before"][h.name]["pid"].split("=")[1])
        assert orphans == set(strays) and main_pid not in orphans and not orphans & set(persist), (h.name, orphans)
        assert all(any(f"pid {p} " in n for n in rows[h.name]["notes"]) for p in strays)
        # nothing was killed: every holder seen before doctor still runs
        assert h.pids_holding("/dev/nvidia0") == held


def test_doctor_changes_nothing(doctored):
    for name, snap in doctored["before"].items():
        assert doctored["after"][name] == snap, name
        assert snap["pid"] != "MainPID=0" and snap["active"] == "active"


def test_text_table_and_fix_lines(doctored):
    proc = doctored["text"]
    assert proc.returncode == 1, proc.stderr[-4000:]
    rows = _table_rows(proc.stdout)
    assert set(rows) == set(EXPECTED), proc.stdout
    for host, verdict in EXPECTED.items():
        assert rows[host][-1] == verdict, (host, rows[host])
    assert rows["gpu-d"][3] == "flashinfer_cutlass"
    fixes = dict(line.split(": ", 1) for line in proc.stdout.splitlines() if re.match(r"^gpu-[a-z]: ", line))
    assert set(fixes) == {"gpu-b", "gpu-c", "gpu-e", "gpu-f", "gpu-g", "gpu-h", "gpu-i"}
    assert fixes == {h: doctored["rows"][h]["fix"] for h in fixes}


def test_narrow_terminal_gets_one_block_per_host(doctored):
    """At 100 columns: no table, one block per host headed by its verdict, every reason whole
    (wrapped at spaces only), no line wider than the terminal; the --fix lines as in the table."""
    from orchestrator.cli.doctor import verdict_reason

    proc = doctored["narrow"]
    assert proc.returncode == 1, proc.stderr[-4000:]
    out = proc.stdout
    fixes = {line.split(": ", 1)[0]: line for line in out.splitlines() if re.match(r"^gpu-[a-z]: ", line)}
    body = "\n".join(line for line in out.splitlines() if not re.match(r"^gpu-[a-z]: ", line))
    assert "┃" not in body and all(len(line) <= 100 for line in body.splitlines()), body
    flat = " ".join(body.split())
    for host, verdict in EXPECTED.items():
        assert re.search(rf"^{host}  {verdict}\s*$", body, re.M), (host, body)
        assert " ".join(verdict_reason(doctored["rows"][host]).split()) in flat, host
    for name in (UP, DOWN):
        assert any(name in line for line in body.splitlines())
    assert set(fixes) == {h for h, r in doctored["rows"].items() if r["fix"]}


def _blocks(text: str) -> dict[str, list[str]]:
    """``host -> its block's lines`` (the ``host  verdict`` line first) of doctor's narrow output."""
    blocks: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        head = re.match(r"^(gpu-\w+)  \S+$", line)
        if head:
            current = blocks.setdefault(head.group(1), [])
        elif not line.startswith("  "):
            current = None  # a blank line or a --fix line ends the block
        if current is not None:
            current.append(line)
    return blocks


def test_the_docs_sample_is_real_output(doctored):
    """docs/doctor.md's sample is this output at 100 columns: the same hosts in the same order,
    each with its verdict, the first line of its reason, the MoE runner's line, and the same lines
    from "device name" on (no path of the machine appears there), the --fix commands with the
    inventory's path shortened. Regenerate it from `pytest -s tests/e2e/test_doctor.py`."""
    page = (REPO / "docs" / "doctor.md").read_text()
    sample = page.split("```text\n", 1)[1].split("```", 1)[0]
    real = doctored["narrow"].stdout
    want, got = _blocks(sample), _blocks(real)
    assert list(want) == list(got) == list(EXPECTED)
    for host in got:
        assert want[host][:2] == got[host][:2], host  # verdict and the reason's first line
        runner = [ln for ln in got[host] if "· MoE runner " in ln or "runner " in ln.split("  ")[-1]]
        assert runner and all(ln in want[host] for ln in runner), (host, runner)
        tail = got[host][next(i for i, ln in enumerate(got[host]) if ln.startswith("  device name")):]
        assert tail == want[host][-len(tail):], host
    fixes = [re.sub(r" \S*hosts\.yaml ", " hosts.yaml ", ln) for ln in real.splitlines() if re.match(r"^gpu-\w+: ", ln)]
    tune_id = doctored["tune_id"]
    assert fixes == [ln.replace(re.search(r"--to (\S+)", ln).group(1), tune_id) if "--to " in ln else ln
                     for ln in sample.splitlines() if re.match(r"^gpu-\w+: ", ln)]


def test_exit_zero_when_all_tuned_or_not_triton(doctored):
    proc = doctored["good"]
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert {h: r["verdict"] for h, r in recap(proc).items()} == {"gpu-a": "tuned", "gpu-d": "not-triton"}


# ---------------------------------------------------------------------------------------------
# Issue 32 rows 12, 13, 14, 16, 18: servers SGLang itself trips on, and one whose signals are
# hidden. One bed of six hosts (the stand-in runs SGLang 0.5.23's real lookup code):
#
#   gpu-a  --enable-deterministic-inference (files installed)      not-applicable; tune skips
#   gpu-b  files installed, triton_3_6_0.bak made beside them        tuned + not-loaded note; tune refused
#   gpu-c  only the up file, triton_3_6_0.bak made after start       broken: will-crash on the down miss
#   gpu-d  SGLANG_MOE_CONFIG_DIR= (empty): the start dies             broken: /root/configs; tune refused
#   gpu-e  up/down disagree on BLOCK_SIZE_M; its Triton cache holds   tuned + two warnings
#          an sm80 kernel and a truncated file
#   gpu-f  --log-level warning, SM120, no orch_gpu_capability,        plan tunes from the log's WARNING
#          nvidia-smi answers compute_cap 12.0                        lines; tune completes; doctor tuned
# ---------------------------------------------------------------------------------------------

BM16 = {"1": dict(CFG["1"], BLOCK_SIZE_M=16), "64": dict(CFG["1"], BLOCK_SIZE_M=64)}
BM_OTHER = {"1": dict(CFG["1"], BLOCK_SIZE_M=32), "64": dict(CFG["1"], BLOCK_SIZE_M=64)}
RTX = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
TRIP = {
    "gpu-a": {"extra_args": ["--enable-deterministic-inference"], "config_files": {UP: CFG, DOWN: CFG}},
    "gpu-b": {"config_files": {UP: CFG, DOWN: CFG}},
    "gpu-c": {"config_files": {UP: CFG}},
    "gpu-d": {"env": {"SGLANG_MOE_CONFIG_DIR": ""}},
    "gpu-e": {"config_files": {UP: BM16, DOWN: BM_OTHER}, "env": {"TRITON_CACHE_DIR": "/srv/triton-cache"}},
    "gpu-f": {"extra_args": ["--log-level", "warning"], "gpu_capability": "12.0", "gpu_name": RTX,
              "nvidia_smi": True},
}


def _kernel(host, folder: str, arch: int, binary: str = "ELF") -> None:
    """A compiled kernel in a Triton cache, as Triton 3.x lays it out (metadata beside the binary)."""
    meta = {"name": "fused_moe_kernel", "target": {"backend": "cuda", "arch": arch, "warp_size": 32}}
    _write(host, f"{folder}/fused_moe_kernel.json", json.dumps(meta))
    _write(host, f"{folder}/fused_moe_kernel.cubin", binary)


@pytest.fixture(scope="module")
def tripped(tmp_path_factory):
    from tests.conftest import _require_testbed

    _require_testbed()
    from tests.testbed.bed import TestBed

    tmp = tmp_path_factory.mktemp("doctor_trips")
    bed = TestBed(n_hosts=len(TRIP), host_options={i: o for i, o in enumerate(TRIP.values())}, workdir=tmp / "bed")
    bed.__enter__()
    try:
        assert [h.name for h in bed.hosts] == list(TRIP)
        for h in bed.hosts:
            if h.name != "gpu-d":
                h.wait_http("/health")
        d = bed.host("gpu-d")  # the empty variable: the real 0.5.23 lookup dies at start
        d.sh(f"for i in $(seq 600); do systemctl is-active {d.unit} >/dev/null || exit 0; sleep 0.1; done; exit 1")
        for name in ("gpu-b", "gpu-c"):
            h = bed.host(name)
            h.sh(f"mkdir -p {h.config_dir}/triton_3_6_0.bak")
        e = bed.host("gpu-e")
        _kernel(e, "/srv/triton-cache/AAAA", 90)
        _kernel(e, "/srv/triton-cache/BBBB", 80)
        _kernel(e, "/srv/triton-cache/CCCC", 90, binary="")
        inv = inventory(bed, tmp / "hosts.yaml")
        data = yaml.safe_load(inv.read_text())
        for group in data["all"]["children"].values():
            (group.get("hosts") or {}).get("gpu-f", {}).pop("orch_gpu_capability", None)
        inv.write_text(yaml.safe_dump(data, sort_keys=False))
        state = tmp / "state"
        pids = {h.name: h.sh(f"systemctl show -p MainPID {h.unit}").stdout.strip() for h in bed.hosts}
        check = orch("tune", str(inv), "--service", "sglang-qwen", "--check", "--json", "--limit", "gpu-f",
                     state_dir=state)
        refused = orch("tune", str(inv), "--service", "sglang-qwen", "--json", "--limit", "gpu-a,gpu-b,gpu-d",
                       state_dir=state)
        after_refused = {h.name: h.sh(f"systemctl show -p MainPID {h.unit}").stdout.strip() for h in bed.hosts}
        tune_f = orch("tune", str(inv), "--service", "sglang-qwen", "--json", "--limit", "gpu-f", state_dir=state)
        doc = orch("doctor", str(inv), "--service", "sglang-qwen", "--json", state_dir=state)
        yield {"bed": bed, "check": check, "refused": refused, "tune_f": tune_f, "doc": doc, "rows": recap(doc),
               "pids": pids, "after_refused": after_refused}
    finally:
        bed.destroy()


def test_deterministic_inference_is_not_applicable_and_tune_stops_nothing(tripped):
    """Row 13: SGLang 0.5.23 reads no file under --enable-deterministic-inference (the stand-in's
    real lookup logs its deterministic line): doctor says not-applicable, tune skips, same MainPID."""
    a = tripped["bed"].host("gpu-a")
    assert "Deterministic inference is enabled, using default MoE kernel config." in a.unit_log()
    row = tripped["rows"]["gpu-a"]
    assert row["verdict"] == "not-applicable" and "--enable-deterministic-inference" in row["why"], row
    r = recap(tripped["refused"])["hosts"]["gpu-a"]
    assert r["outcome"] != "failed" and r["summary"]["plan"]["action"] == "skip", r
    assert "--enable-deterministic-inference is set" in r["summary"]["plan"]["reason"]
    assert tripped["after_refused"]["gpu-a"] == tripped["pids"]["gpu-a"]


def test_unparsable_triton_folder_is_named_with_its_state_and_tune_refuses_the_root(tripped):
    """Row 12: ``triton_3_6_0.bak`` beside the Triton folder. With both files there it is never read
    (``not-loaded``); with the down file missing the next start's lookup lists the root and dies
    (``will-crash``, broken). A tune refuses to install into such a root before anything stops."""
    bed, rows = tripped["bed"], tripped["rows"]
    b, c = bed.host("gpu-b"), bed.host("gpu-c")
    rb, rc = rows["gpu-b"], rows["gpu-c"]
    assert rb["verdict"] == "tuned", rb
    assert any(n.startswith(f"not-loaded: {b.config_dir}/triton_3_6_0.bak: never read") for n in rb["notes"]), rb
    assert rc["verdict"] == "broken" and "ValueError" in rc["why"], rc
    assert any(n.startswith(f"will-crash: {c.config_dir}/triton_3_6_0.bak: SGLang lists {c.config_dir} on a miss "
                            "(down file not in its Triton folder)") for n in rc["notes"]), rc
    r = recap(tripped["refused"])["hosts"]["gpu-b"]
    assert r["outcome"] == "failed" and "Plan the files to write" in r["cause"], r
    assert f"{b.config_dir}/triton_3_6_0.bak (not-loaded" in r["cause"] and "nothing was stopped" in r["cause"]
    assert tripped["after_refused"]["gpu-b"] == tripped["pids"]["gpu-b"]
    from remote.engines.sglang.naming import unparsable_triton_folders

    assert unparsable_triton_folders(b.sh(f"ls {b.config_dir}").stdout.split()) == ["triton_3_6_0.bak"]


def test_empty_moe_config_dir_is_broken_with_the_folder_and_tune_refuses(tripped):
    """Row 12: ``SGLANG_MOE_CONFIG_DIR=`` (empty): SGLang 0.5.23 looks in ``configs`` under the unit's
    working directory (/root); none is there, so its start died (FileNotFoundError). Doctor names
    the folder; a tune refuses before anything."""
    d, row = tripped["bed"].host("gpu-d"), tripped["rows"]["gpu-d"]
    assert "FileNotFoundError" in d.unit_log() and d.unit_state() in ("failed", "inactive")
    assert row["verdict"] == "broken" and row["why"].startswith("/root/configs does not exist: SGLANG_MOE_CONFIG_DIR "
                                                                 "is set but empty"), row
    assert row["hazards"]["config_dir"]["state"] == "will-crash"
    r = recap(tripped["refused"])["hosts"]["gpu-d"]
    assert r["outcome"] == "failed" and "SGLANG_MOE_CONFIG_DIR is set but empty" in r["cause"], r
    assert "nothing was stopped" in r["cause"]


def test_mismatched_pair_and_a_copied_triton_cache_are_warned(tripped):
    """Row 14: the installed pair disagrees on BLOCK_SIZE_M at M=1..32 (the stand-in's 0.5.23
    lookup overrode the down value and said so); row 16: the server's Triton cache holds a kernel
    compiled for sm80 on this sm90 host and a truncated binary; doctor warns of both and says
    orch tune reused nothing from the cache. Verdict tuned: the files are the ones loaded."""
    e, row = tripped["bed"].host("gpu-e"), tripped["rows"]["gpu-e"]
    assert "overriding down BLOCK_SIZE_M to match" in e.unit_log()
    assert row["verdict"] == "tuned", row
    assert "M=1..32 (up entry 1: 16, down entry 1: 32)" in row["pair_mismatch"] and "never measured" in \
        row["pair_mismatch"], row
    cache = row["triton_cache"]
    assert cache["path"] == "/srv/triton-cache" and cache["archs"] == {"80": 1, "90": 2}
    assert cache["other_arch"] == 1 and cache["truncated"] == ["/srv/triton-cache/CCCC/fused_moe_kernel.cubin"]
    note = next(n for n in row["notes"] if "Triton cache" in n)
    assert "another GPU architecture (sm80 x1, sm90 x2)" in note and "orch tune reused nothing from it" in note


def test_quiet_server_without_a_cuda_context_is_tuned_from_every_signal(tripped):
    """Row 18: ``--log-level warning`` hides SGLang's start line and ``Using MoE kernel config`` lines,
    the probe opens no CUDA context (the bed has none) and orch_gpu_capability is not set. Plan takes
    the names from the last invocation's WARNING lookup lines and the GPU generation from nvidia-smi
    (tests/unit/tasks/cases/plan.json has each signal alone), the tune completes (the loaded files
    are not proven from a quiet log, the benchmark after decides), and doctor, whose log then has no
    lookup line at all, takes sm120 from nvidia-smi's compute_cap."""
    f = tripped["bed"].host("gpu-f")
    check = recap(tripped["check"])["hosts"]["gpu-f"]
    assert check["outcome"] == "check", check
    plan = check["summary"]["plan"]
    # both signals: the names from the last invocation's WARNING lookup lines (no start line in the
    # log), the runner's GPU generation from nvidia-smi (sm120); they agree
    assert plan["action"] == "tune" and plan["names_source"] == "log", plan
    assert plan["runner"]["runner"] == "triton" and "sm120" in plan["runner"]["reason"], plan["runner"]
    assert "server_args=" not in f.unit_log()
    r = recap(tripped["tune_f"])["hosts"]["gpu-f"]
    assert r["outcome"] == "completed", (r, tripped["tune_f"].stderr[-4000:])
    row = tripped["rows"]["gpu-f"]
    assert row["verdict"] == "tuned", row
    assert row["runner"]["runner"] == "triton" and "sm120" in row["runner"]["reason"], row["runner"]
    assert any(n.startswith("--log-level warning: SGLang logs the files it loaded") for n in row["notes"])
    name = UP.replace("NVIDIA_H200", RTX.replace(" ", "_"))
    assert f.sh(f"test -f {f.triton_dir}/{name}", check=False).returncode == 0
