"""The ``vllm/vllm-openai`` image's entry point and the ``vllm`` console script, held against the
real build files of vLLM releases: the ``ENTRYPOINT`` of stage ``vllm-openai`` in each release's
``docker/Dockerfile`` and ``[project.scripts]`` in its ``pyproject.toml`` (both kept from the
release's sdist by ``tests/vllm_releases.py``). 0.11.0 and 0.11.1 are read beside the oracle
releases because the image's entry point changed between them."""

from __future__ import annotations

import json
import re

import pytest

from remote.engines.vllm import server_args as sa
from remote.engines.vllm.launcher import is_vllm_script
from tests.vllm_releases import ORACLE_RELEASES, source_tree

#: the last release whose image runs the api_server module, and the first that runs `vllm serve`
BOUNDARY = ("0.11.0", "0.11.1")


def _stage_entrypoint(dockerfile: str, stage: str) -> tuple[str, ...]:
    """The exec-form ``ENTRYPOINT`` that stage ``stage`` of ``dockerfile`` ends with (the last one
    given in the stage, as Docker applies them)."""
    found, inside = None, False
    for line in dockerfile.splitlines():
        m = re.match(r"\s*FROM\s+\S+(?:\s+AS\s+(\S+))?\s*$", line, re.I)
        if m:
            inside = (m.group(1) or "").lower() == stage
            continue
        e = re.match(r"\s*ENTRYPOINT\s+(\[.*\])\s*$", line)
        if inside and e:
            found = tuple(json.loads(e.group(1)))
    assert found is not None, f"no ENTRYPOINT in stage {stage}"
    return found


@pytest.mark.parametrize("version", [*BOUNDARY, *ORACLE_RELEASES])
def test_the_image_entrypoint_is_the_releases(version):
    text = (source_tree(version) / "sdist" / "docker" / "Dockerfile").read_text()
    real = _stage_entrypoint(text, "vllm-openai")
    for image in (f"vllm/vllm-openai:v{version}", f"docker.io/vllm/vllm-openai:v{version}"):
        assert sa.image_entrypoint(image) == real, (version, image, real)
    # the command orch reads from `docker run IMAGE MODEL -tp 2` is the one the release's image runs
    assert sa.container_command(f"vllm/vllm-openai:v{version}", None, ["/m", "-tp", "2"]) == [*real, "/m", "-tp", "2"]


def test_the_newest_release_decides_an_image_without_a_release_tag():
    newest = _stage_entrypoint((source_tree(ORACLE_RELEASES[-1]) / "sdist" / "docker" / "Dockerfile").read_text(),
                               "vllm-openai")
    for image in ("vllm/vllm-openai", "vllm/vllm-openai:latest", "vllm/vllm-openai:nightly",
                  "vllm/vllm-openai@sha256:" + "0" * 64):
        assert sa.image_entrypoint(image) == newest, image


@pytest.mark.parametrize("version", ORACLE_RELEASES)
def test_the_console_script_is_the_releases(version):
    text = (source_tree(version) / "sdist" / "pyproject.toml").read_text()
    section = re.search(r"^\[project\.scripts\]\n(.*?)(?=^\[|\Z)", text, re.M | re.S)
    assert section, version
    scripts = dict(re.findall(r'^\s*([\w.-]+)\s*=\s*"([^"]+)"', section.group(1), re.M))
    assert set(sa.ENTRY_POINTS.scripts) <= set(scripts), (version, scripts)
    module, func = scripts["vllm"].split(":")
    # the script pip and uv generate for that entry point (distlib's template: the import, then main)
    generated = (f"#!/venv/bin/python3\n# -*- coding: utf-8 -*-\nimport re\nimport sys\nfrom {module} import {func}\n"
                 f"if __name__ == '__main__':\n    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n"
                 f"    sys.exit({func}())\n")
    assert is_vllm_script(generated), (version, scripts["vllm"])
    # the image's `vllm serve` is that console script
    image = _stage_entrypoint((source_tree(version) / "sdist" / "docker" / "Dockerfile").read_text(), "vllm-openai")
    assert image[0] in scripts and image[1] == sa.ENTRY_SERVE.split()[1], (version, image)
