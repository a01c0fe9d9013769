"""The device-plugin DaemonSet of the chart (devicePlugin.enabled): rendered, validated, linted, least privilege."""

from __future__ import annotations

import pytest
from deploy_helpers import CHART, Render, by_kind, one, pod_spec, run_helm
from test_chart import validate_object

pytestmark = pytest.mark.helm

ON = "devicePlugin.enabled=true"


def test_off_by_default(render: Render) -> None:
    names = [d["metadata"]["name"] for d in render()]
    assert not [n for n in names if "device-plugin" in n]


def test_daemonset_serves_the_kubelet_socket_folder(render: Render) -> None:
    docs = render(None, ON)
    for doc in docs:
        validate_object(doc)
    ds = one(docs, "DaemonSet", "device-plugin")
    spec = pod_spec(ds)
    assert spec["priorityClassName"] == "system-node-critical"
    (c,) = spec["containers"]
    assert c["args"][:2] == ["device-plugin", "--socket-dir=/var/lib/kubelet/device-plugins"]
    assert {"--resource=nvidia.com/gpu", "--resource=kelvin.dev/shared-gpu", "--shared-slots-per-gpu=16"} <= set(
        c["args"]
    )
    assert {"name": "device-plugins", "mountPath": "/var/lib/kubelet/device-plugins"} in c["volumeMounts"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["device-plugins"]["hostPath"] == {"path": "/var/lib/kubelet/device-plugins", "type": "Directory"}
    sc = c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert "kelvin-gpu.sock" in " ".join(c["livenessProbe"]["exec"]["command"])
    (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": "kelvin.dev/device-plugin", "operator": "In", "values": ["true"]}]
    assert {"key": "kelvin.dev/device-plugin", "operator": "Exists"} in spec["tolerations"]
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert spec["serviceAccountName"] == one(docs, "ServiceAccount", "device-plugin")["metadata"]["name"]


def test_values_reach_the_args(render: Render) -> None:
    docs = render(
        None,
        ON,
        "devicePlugin.sharedSlotsPerGpu=4",
        "devicePlugin.deviceListStrategy=cdi",
        "devicePlugin.resourceNames={kelvin.dev/shared-gpu}",
        "devicePlugin.image.tag=dev",
    )
    (c,) = pod_spec(one(docs, "DaemonSet", "device-plugin"))["containers"]
    assert "--shared-slots-per-gpu=4" in c["args"] and "--device-list-strategy=cdi" in c["args"]
    assert [a for a in c["args"] if a.startswith("--resource=")] == ["--resource=kelvin.dev/shared-gpu"]
    assert c["image"].endswith(":dev")
    assert "kelvin-shared-gpu.sock" in " ".join(c["livenessProbe"]["exec"]["command"])


def test_rbac_reads_and_marks_pods_only(render: Render) -> None:
    docs = render(None, ON)
    role = one(docs, "ClusterRole", "device-plugin")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "patch"]}]
    binding = one(docs, "ClusterRoleBinding", "device-plugin")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert [s["name"] for s in binding["subjects"]] == [
        one(docs, "ServiceAccount", "device-plugin")["metadata"]["name"]
    ]
    assert len(by_kind(docs, "DaemonSet")) == 2  # the exporter's and the plugin's


def test_lint_strict_with_the_plugin(helm_bin: str) -> None:
    proc = run_helm(helm_bin, "lint", "--strict", str(CHART), "--set", ON, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("setting", "complaint"),
    [
        ("devicePlugin.sharedSlotsPerGpu=0", "sharedSlotsPerGpu"),
        ("devicePlugin.resourceNames={amd.com/gpu}", "resourceNames"),
        ("devicePlugin.deviceListStrategy=volume-mounts", "deviceListStrategy"),
        ("devicePlugin.enable=true", "enable"),
    ],
)
def test_schema_rejects_bad_plugin_values(helm_bin: str, setting: str, complaint: str) -> None:
    proc = run_helm(helm_bin, "template", "kelvin", str(CHART), "--set", setting, check=False)
    assert proc.returncode != 0, f"--set {setting} was accepted"
    assert complaint in proc.stderr, proc.stderr
