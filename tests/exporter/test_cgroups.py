"""pid -> pod attribution from /proc/<pid>/cgroup, for every cgroup layout kubelet produces."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler_plugin.exporter.cgroups import PodDirectory, pod_uid_for_pid, pod_uid_from_cgroup

UID = "0f6c2b8e-3a1d-4c5e-9b7f-2d4e6a8c0b1d"
USCORE = UID.replace("-", "_")


@pytest.mark.parametrize(
    "text",
    [
        # cgroup v1, cgroupfs driver, containerd (burstable and guaranteed)
        f"12:pids:/kubepods/burstable/pod{UID}/4f1c0d9e8b7a\n11:memory:/kubepods/burstable/pod{UID}/4f1c0d9e8b7a\n",
        f"5:cpu,cpuacct:/kubepods/pod{UID}/b2c3d4e5f6a7\n",
        # cgroup v1, systemd driver, docker
        f"4:memory:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{USCORE}.slice/docker-ab12.scope\n",
        # cgroup v2, systemd driver, containerd and CRI-O
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{USCORE}.slice/cri-containerd-9f8e.scope\n",
        f"0::/kubepods.slice/kubepods-pod{USCORE}.slice/crio-7d6c5b4a.scope\n",
        # cgroup v2, cgroupfs driver
        f"0::/kubepods/besteffort/pod{UID}/0a1b2c3d4e5f\n",
        # nested (kind / k3s): kubelet.slice prefix, containerd's systemd-in-container form
        f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/"
        f"kubelet-kubepods-burstable-pod{USCORE}.slice/cri-containerd-1234.scope\n",
        f"0::/system.slice/containerd.service/kubepods-burstable-pod{USCORE}.slice:cri-containerd:5678\n",
    ],
)
def test_pod_uid_in_every_layout(text: str) -> None:
    assert pod_uid_from_cgroup(text) == UID


@pytest.mark.parametrize(
    "text",
    [
        "0::/system.slice/sshd.service\n",
        "0::/user.slice/user-1000.slice/session-3.scope\n",
        "12:memory:/docker/4f1c0d9e8b7a\n",
        "",
    ],
)
def test_processes_outside_pods_have_no_uid(text: str) -> None:
    assert pod_uid_from_cgroup(text) is None


def test_pid_lookup_reads_the_configured_proc_root(tmp_path: Path) -> None:
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text(f"0::/kubepods/besteffort/pod{UID}/abc\n")
    assert pod_uid_for_pid(tmp_path, 4242) == UID
    assert pod_uid_for_pid(tmp_path, 4243) is None  # exited


def test_pod_directory_names_pods_and_relists_for_new_uids(tmp_path: Path) -> None:
    now = [0.0]
    pods = PodDirectory(tmp_path, min_relist_s=5, clock=lambda: now[0])
    (tmp_path / f"ml-team_train-0_{UID}").mkdir()
    (tmp_path / "not-a-pod-dir").mkdir()
    assert pods.lookup(UID) == ("ml-team", "train-0")
    other = "11111111-2222-3333-4444-555555555555"
    (tmp_path / f"kube-system_coredns-abc_{other}").mkdir()
    assert pods.lookup(other) is None  # relisted too recently
    now[0] = 6.0
    assert pods.lookup(other) == ("kube-system", "coredns-abc")
    assert PodDirectory(None).lookup(UID) is None
