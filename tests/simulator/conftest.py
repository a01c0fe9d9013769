from __future__ import annotations

from pathlib import Path

import pytest

NODES_CSV = """sn,cpu_milli,memory_mib,gpu,model
n0,32000,131072,2,T4
n1,32000,131072,2,T4
n2,64000,262144,4,V100M32
"""

PODS_CSV = """name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,\
scheduled_time
p0,4000,8192,1,1000,,LS,Running,0,10,0
p1,2000,4096,1,500,,LS,Running,0,10,0
p2,2000,4096,1,500,,LS,Running,0,10,0
p3,8000,16384,2,1000,,LS,Running,0,10,0
p4,1000,2048,0,0,,BE,Running,0,10,0
p5,2000,4096,1,250,T4,LS,Running,0,10,0
p6,4000,8192,1,1000,V100M32,LS,Running,0,10,0
"""


@pytest.fixture
def small_trace(tmp_path: Path) -> tuple[Path, Path]:
    nodes = tmp_path / "nodes.csv"
    pods = tmp_path / "pods.csv"
    nodes.write_text(NODES_CSV)
    pods.write_text(PODS_CSV)
    return nodes, pods
