"""The licence the metadata names is in the repository, and install.md's image instructions fit the chart: kelvin
publishes no image, so the docs say how to build, push and select one, with the names the chart and manifest use."""

from __future__ import annotations

import hashlib
import re
import tomllib

import yaml
from deploy_helpers import CHART, ROOT, load_docs, pod_spec

# sha256 of the Apache License 2.0 as published at https://www.apache.org/licenses/LICENSE-2.0.txt
APACHE_2_0_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"


def test_license_is_the_apache_2_0_text_the_metadata_names() -> None:
    text = (ROOT / "LICENSE").read_bytes()
    assert hashlib.sha256(text).hexdigest() == APACHE_2_0_SHA256, "LICENSE is not the standard Apache-2.0 text"
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "Apache-2.0" in str(pyproject["license"])
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["annotations"]["artifacthub.io/license"] == "Apache-2.0"
    assert 'org.opencontainers.image.licenses="Apache-2.0"' in (ROOT / "Dockerfile").read_text()


def test_install_md_says_the_image_is_not_published_and_how_to_use_your_own() -> None:
    doc = (ROOT / "docs" / "install.md").read_text()
    section = doc.split("## The image", 1)[1].split("\n## ", 1)[0]
    assert "kelvin publishes no\nimage" in section or "kelvin publishes no image" in section
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    default = f"{values['image']['repository']}:{values['image']['tag'] or app_version}"
    # what the manifest runs is the default the sed command replaces
    images = {
        c["image"]
        for d in load_docs((ROOT / "manifests" / "kelvin.yaml").read_text())
        if d["kind"] in {"Deployment", "DaemonSet"}
        for c in pod_spec(d)["containers"]
        if "kube-scheduler" not in c["image"]
    }
    assert images == {default}
    assert f"s#{default}#$REGISTRY/kelvin:{app_version}#" in section
    for command in ("docker build -t", "docker push", "--set image.repository=", "--set image.tag="):
        assert command in section, command
    assert re.search(r"helm install kelvin \./helm/kelvin .*\\\n\s+--set image\.repository=", section)
