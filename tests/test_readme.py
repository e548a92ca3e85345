"""The README and docs/ document what the code does: the variable table, commands, playbooks,
timings, costs and downloads, each claim held against the code or the page it comes from."""

import os
import re
import shlex
import sys
from pathlib import Path

from orchestrator.cli import build_parser
from orchestrator.inventory import known_vars_markdown
from tests.waiting import run_watched

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
DOCS = sorted((ROOT / "docs").glob("*.md"))


def doc(name: str) -> str:
    return (ROOT / "docs" / name).read_text()


def test_readme_is_short():
    """The README is a page to start from (what orch is, set-up, the demo, the tests, a real
    fleet, links); the reference lives in docs/, one page per topic."""
    assert len(README.encode()) <= 10_240


def test_every_docs_page_is_linked_from_the_readme():
    for page in DOCS:
        assert f"](docs/{page.name}" in README, page.name


def test_variable_table_is_current():
    assert known_vars_markdown().strip() in doc("inventory.md")


def test_every_command_is_documented():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for name in sub.choices:
        assert f"orch {name}" in README, name
        assert f"`orch {name}" in doc("commands.md"), name


def test_readme_commands_exist():
    root = Path(__file__).resolve().parents[1]
    for script in ("scripts/demo.sh", "scripts/test.sh", "scripts/setup.sh"):
        assert script in README or script == "scripts/setup.sh"
        assert (root / script).exists()
    assert "bash scripts/test.sh" in (root / ".ci" / "run").read_text()


def test_task_reference_is_current():
    from orchestrator.engine.task import reference_markdown
    from orchestrator.tasks import TASKS

    assert reference_markdown(TASKS).strip() in (ROOT / "docs" / "playbooks.md").read_text()


def console_examples() -> list[tuple[str, str]]:
    """``(command, expected stdout)`` of every ``$ `` line in the ```console blocks of the README
    and of docs/: the lines after a command, up to the next ``$ `` line or the block's end, are its
    output."""
    out = []
    text = "\n".join([README, *(p.read_text() for p in DOCS)])
    for block in re.findall(r"^```console\n(.*?)^```", text, re.S | re.M):
        for part in re.split(r"^\$ ", block, flags=re.M)[1:]:
            command, _, output = part.partition("\n")
            out.append((command, output))
    return out


def test_readme_has_runnable_examples():
    commands = [c for c, _ in console_examples()]
    assert any(c.startswith(".venv/bin/orch config-names --model-config tests/data/models/") for c in commands)


def test_console_examples_print_what_the_readme_says():
    """Each documented command runs from the repo root as written (``.venv/bin/orch`` is this
    interpreter's ``python -m orchestrator`` when the repo has no .venv) and prints exactly the
    lines the README shows."""
    root = Path(__file__).resolve().parents[1]
    for command, expected in console_examples():
        argv = shlex.split(command)
        if argv[0] == ".venv/bin/orch" and not os.access(root / argv[0], os.X_OK):
            argv = [sys.executable, "-m", "orchestrator", *argv[1:]]
        r = run_watched(argv, cwd=root)
        assert r.returncode == 0, (command, r.stderr[-2000:])
        assert r.stdout == expected, (command, r.stdout, expected)


def test_supported_releases_and_architectures_are_what_the_tests_cover():
    """The README counts the releases of docs/sglang-releases.md's table (whose rows the oracle
    tests compute from each release's code) and the families of the model table, whose list
    docs/sglang-models.md carries as generated."""
    from remote.engines.sglang.architectures import ARCHITECTURES
    from tests.sglang_loader import ORACLE_RELEASES

    releases = doc("sglang-releases.md")
    i = releases.index("| Release | Lookup module |")
    rows = [ln for ln in releases[i:releases.index("\n\n", i)].splitlines()[2:] if ln.startswith("|")]
    assert len(rows) == len(ORACLE_RELEASES)
    names = list(dict.fromkeys(r.family for r in ARCHITECTURES))
    assert f"the {len(rows)} SGLang releases and {len(names)} model families orch follows" in README
    families = "; ".join(names) + "."
    assert ("<!-- generated: remote.engines.sglang.architectures.ARCHITECTURES families -->\n" + families
            in doc("sglang-models.md"))


# ----------------------------------------------------------------------------- claims that can be checked


def slug(heading: str) -> str:
    """GitHub's anchor for a markdown heading: lower case, punctuation other than ``-`` and ``_``
    dropped, spaces to ``-``."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    out: set[str] = set()
    in_code = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and re.match(r"^#{1,6} ", line):
            out.add(slug(line.lstrip("#")))
    return out


def links(path: Path) -> list[tuple[str, str]]:
    """``(target path or "", anchor or "")`` of every relative markdown link in ``path``."""
    out = []
    for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
        if re.match(r"^[a-z]+://", target):
            continue
        file, _, anchor = target.partition("#")
        out.append((file, anchor))
    return out


def test_links_and_anchors_resolve():
    """Every relative link of the README and docs/ names a file of the repository, and every
    ``#anchor`` a heading of its file (an anchor carrying a renamed heading fails here)."""
    for doc in [ROOT / "README.md", *DOCS]:
        for file, anchor in links(doc):
            target = (doc.parent / file).resolve() if file else doc
            assert target.exists(), f"{doc.name}: link to {file} (missing)"
            if anchor:
                assert anchor in anchors(target), f"{doc.name}: #{anchor} is no heading of {target.name}"


def test_repository_paths_named_in_the_readme_exist():
    """Paths in backquotes that look like the repository's own (scripts/, docs/, tests/, playbooks/,
    inventories/, remote/, orchestrator/, bench/) in the README and docs/ exist; a glob or a
    placeholder is left alone."""
    named = set(re.findall(r"`((?:scripts|docs|tests|playbooks|inventories|remote|orchestrator|bench|\.ci)/"
                           r"[\w./-]*)`", "\n".join([README, *(p.read_text() for p in DOCS)])))
    assert named
    # written by the demo (tests/testbed `up`), not part of a clone
    written = {"inventories/testbed.yaml"}
    assert 'REPO / "inventories" / "testbed.yaml"' in (ROOT / "tests" / "testbed" / "__main__.py").read_text()
    for path in sorted(named - written):
        if any(c in path for c in "*<>{") or "..." in path:
            continue
        assert (ROOT / path).exists(), path


def test_commands_and_flags_named_in_the_readme_exist():
    """Every ``orch CMD`` in a code span or block of the README and docs/ is a command, and every
    ``--flag`` on the same line after it is one of that command's flags."""
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    text = "\n".join([README, *(p.read_text() for p in DOCS)])
    spans = re.findall(r"`([^`\n]+)`", text) + [ln for ln in text.splitlines() if ln.startswith("    ")]
    seen = 0
    for span in spans:
        lead = re.match(r"\s*(?:\.venv/bin/)?orch ([a-z][\w-]*)", span)
        if lead:  # a span that is a command line: its command must exist
            assert lead.group(1) in sub.choices, f"orch {lead.group(1)}: no such command ({span})"
        for m in re.finditer(r"\borch ([a-z][\w-]*)", span):
            cmd = m.group(1)
            if cmd in ("doctor", "tune", "rollback", "runs", "bench", "recover", "report", "configs",
                       "config-names") or not cmd.isalpha() or cmd in sub.choices:
                assert cmd in sub.choices, f"orch {cmd}: no such command ({span})"
            else:
                continue
            seen += 1
            flags = {o for a in sub.choices[cmd]._actions for o in a.option_strings}
            rest = span[m.end():].split("orch ", 1)[0].split("#", 1)[0]
            for flag in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", rest):
                assert flag in flags, f"orch {cmd} has no {flag} ({span})"
    assert seen > 10


def test_timings_are_the_recorded_ones():
    """The README's timings are docs/timings.md's measurements, rounded to minutes, with the
    test count the suite's row records."""
    rows, counts = {}, {}
    for line in doc("timings.md").splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 3 and cells[1].isdigit():
            key = cells[0].split("`")[1]
            rows[key] = int(cells[1])
            count = re.search(r"([\d,]+) tests", cells[0])
            if count:
                counts[key] = count.group(1)
    minutes = {k: round(v / 60) for k, v in rows.items()}
    quick = minutes['bash scripts/test.sh -m "not testbed"']
    text = " ".join(README.split())
    assert (f"set-up about {minutes['bash scripts/setup.sh']} minutes, the demo about "
            f"{minutes['bash scripts/demo.sh']} minutes with set-up included, the quick tier about "
            f"{quick} minutes and the whole suite about "
            f"{minutes['bash scripts/test.sh']} minutes ({counts['bash scripts/test.sh']} tests)") in text


def test_gpu_cost_is_what_the_benchmarks_measured():
    """What a tune costs (README) is docs/benchmarks.md §4's numbers, rounded."""
    bench = (ROOT / "docs" / "benchmarks.md").read_text()
    one = float(re.search(r"\*\*missed\*\*: ([\d.]+) s wall on one GPU", bench).group(1))
    two = float(re.search(r"; ([\d.]+) s on both GPUs of the same machine", bench).group(1))
    lo, hi = re.search(r"\*\*met\*\*: ([\d.]+)x to ([\d.]+)x at all 7 M ≥ 256", bench).groups()
    cost = README[README.index("## What a tune costs on a real GPU"):README.index("## On a real fleet")]
    assert f"took {round(one)} s" in cost and f"it took {round(two)} s" in cost
    assert f"{lo}x to {hi}x faster than\nSGLang's default config from M=256 up" in cost
    assert "Qwen3-30B-A3B at TP1 (E=128, N=768" in cost and "18 batch sizes" in cost
    assert "not run anywhere" not in bench


def test_network_and_disk_claims():
    """The download and leftover claims: the release count and cache folder, the pre-fill
    command, what `demo.sh down` and the test bed print."""
    from orchestrator.ui import PROGRESS_INTERVAL_S
    from tests.sglang_releases import needed_releases

    setup = doc("setup.md")
    assert f"{len(needed_releases())}\n  releases" in setup or f"{len(needed_releases())} releases" in setup
    assert "`~/.cache/orch/sglang`" in README and "`.venv/bin/python -m tests.sglang_releases`" in setup
    testbed = (ROOT / "tests" / "testbed" / "__main__.py").read_text()
    assert "bash scripts/demo.sh down" in testbed  # what `up` tells, the README's words
    assert "exec .venv/bin/python -m tests.testbed down" in (ROOT / "scripts" / "demo.sh").read_text()
    assert "def leftovers" in testbed and "bash scripts/demo.sh down" in README and "`bash scripts/demo.sh down`" in setup
    for kept in ("/run/orchtb/.lock", "`.setup/installed-packages`", "`~/.local/state/orch/`"):
        assert kept in setup, kept  # what `down` names (tests/unit/test_sglang_cache.py holds it does)
    assert f"every {PROGRESS_INTERVAL_S:g} s" in README
    # the demo's inventory logs in as root (tests/testbed/bed.py makes each host's SSH user root)
    assert "the demo's inventory logs in as `root`" in README.replace("\n", " ")
    assert re.search(r'Host\(name=name, address=[^\n]*user="root"', (ROOT / "tests" / "testbed" / "bed.py").read_text())


def test_no_internal_issue_numbers_in_readme_anchors():
    assert not re.search(r"#[\w-]*issue-\d+", README)


def test_bench_results_stay_small_and_every_cited_file_is_there():
    """bench/results keeps summaries and config files plain and larger raw files gzip-compressed
    (its README): no plain file over 16 KB, under 500 KB in all; every results file that
    docs/benchmarks.md or a results README names exists (a compressed one under its ``.gz`` name)."""
    results = ROOT / "bench" / "results"
    files = [p for p in results.rglob("*") if p.is_file()]
    plain = [p for p in files if p.suffix != ".gz" and p.name != "README.md" and p.stat().st_size > 16_000]
    assert not plain, plain
    assert sum(p.stat().st_size for p in files) < 500_000
    names = {p.name for p in files}
    for doc in [ROOT / "docs" / "benchmarks.md", *results.rglob("README.md")]:
        for name in re.findall(r"`(?:[\w./-]*/)?([\w.=,-]+\.(?:json|log|txt)(?:\.gz)?)`", doc.read_text()):
            # a name of a file kept compressed must say .gz (a name of no results file, such as
            # the script's default output or a model config, is not checked, nor the tuner's
            # report.json and checkpoint.json as names of what a tune writes)
            if name in ("report.json", "checkpoint.json"):
                continue
            assert name in names or name + ".gz" not in names, f"{doc}: {name} is kept as {name}.gz"
            assert not name.endswith(".gz") or name in names, f"{doc}: {name} is not in bench/results"
