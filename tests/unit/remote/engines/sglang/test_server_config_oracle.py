"""The real SGLang releases are the judge of the ``--config FILE.yaml`` merge rule
(:mod:`remote.engines.sglang.server_config`): the release's own ``ConfigArgumentMerger`` gives the
argument list orch's merge gives (moved here from tests/unit/facts/test_unit_sources.py with the
rule, issue 28)."""

from __future__ import annotations

import argparse
import importlib.util

import pytest
import yaml

from remote.engines.sglang.server_args import BOOL_FLAGS, parse_server_args
from remote.engines.sglang.server_config import merged_args

PY = "/opt/venv/bin/python"
YAML = "model-path: /models/qwen3\ntp-size: 4\nport: 30001\ndisable-shared-experts-fusion: true\n"


def _real_merger(release: str = "0.5.23"):
    """The release's own ConfigArgumentMerger module (fetched SGLang source; skip when unavailable)."""
    from tests.sglang_releases import ReleaseUnavailable, source_tree
    from tests.testbed.standin_tree import CONFIG_PARSER_PATHS

    try:
        root = source_tree(release)
    except ReleaseUnavailable as exc:  # pragma: no cover - offline machine
        pytest.skip(str(exc))
    path = next(root / rel for rel in CONFIG_PARSER_PATHS if (root / rel).is_file())
    spec = importlib.util.spec_from_file_location(f"sglang_{release.replace('.', '_')}_config_parser", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("release", ["0.5.8", "0.5.23"])
@pytest.mark.parametrize("yaml_text, argv", [
    (YAML, ["--config", "/x/q.yaml", "--port", "30002"]),
    ("model-path: /m\ntp-size: 2\ndisable-shared-experts-fusion: false\nenable-metrics: true\n",
     ["--host", "0.0.0.0", "--config", "/x/q.yaml"]),
    ("cuda-graph-bs: [1, 2, 4]\njson-model-override-args: {\"a\": 1}\nmem-fraction-static: 0.8\n",
     ["--config", "/x/q.yml", "--model-path", "/m"]),
    ("", ["--model-path", "/m", "--config", "/x/q.yaml"]),
])
def test_merge_agrees_with_the_real_sglang_merger(release, yaml_text, argv, tmp_path):
    """orch's merge gives the argument list SGLang's own ConfigArgumentMerger gives (for a parser
    whose store_true flags are the ones orch knows plus enable-metrics, as in SGLang)."""
    mod = _real_merger(release)
    cfg = tmp_path / argv[argv.index("--config") + 1].rsplit("/", 1)[1]
    cfg.write_text(yaml_text)
    real_argv = [str(cfg) if a.startswith("/x/") else a for a in argv]
    parser = argparse.ArgumentParser()
    for flag in ("--model-path", "--tp-size", "--port", "--host", "--mem-fraction-static", "--config",
                 "--json-model-override-args"):
        parser.add_argument(flag)
    parser.add_argument("--cuda-graph-bs", nargs="+")
    for flag in ("--disable-shared-experts-fusion", "--enable-metrics"):
        parser.add_argument(flag, action="store_true")
    if release == "0.5.8" and "{" in yaml_text:
        pytest.skip("0.5.8 passes a mapping as str(dict), 0.5.23 as JSON; orch follows 0.5.23 (it reads no such flag)")
    real = mod.ConfigArgumentMerger(parser).merge_config_with_args(list(real_argv))
    ours = merged_args(real_argv, yaml.safe_load(yaml_text), str(cfg), store_true=set(BOOL_FLAGS) | {"enable_metrics"})
    assert ours == real
    # and orch reads from the merged list what argparse reads from it
    ns = parser.parse_args(real)
    sa = parse_server_args([PY, "-m", "sglang.launch_server"], real)
    assert (sa.model_path, sa.tp, sa.port) == (ns.model_path, int(ns.tp_size or 1), int(ns.port or 30000))
    assert sa.disable_shared_experts_fusion == ns.disable_shared_experts_fusion
