"""Trace input: openb CSV and kelvin's own YAML/CSV, with errors that name the row and column."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler_plugin.model import GIB, MIB
from scheduler_plugin.simulator.fleet import build_fleet
from scheduler_plugin.simulator.trace import TraceError, load_nodes, load_pods, load_trace

HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"


def test_openb_files_parse(small_trace: tuple[Path, Path]) -> None:
    trace = load_trace(*small_trace)
    assert trace.total_gpus == 8
    assert trace.nodes[2].model == "V100M32" and trace.nodes[2].memory_bytes == 262144 * MIB
    p1, p3, p4, p5 = trace.pods[1], trace.pods[3], trace.pods[4], trace.pods[5]
    assert p1.request().shared and p1.request().milli == 500
    assert p3.request().count == 2 and p3.request().whole and p3.gpu_demand_milli == 2000
    assert not p4.request().wants_gpu and p4.gpu_demand_milli == 0
    assert p5.request().models == frozenset({"T4"})


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ("p,abc,1,1,1000,\n", r"row 2, column 'cpu_milli': 'abc' is not an integer"),
        ("p,1000,1,1,2000,\n", r"row 2, column 'gpu_milli': 2000 must be between 0 and 1000"),
        ("p,1000,1,2,500,\n", r"row 2, column 'gpu_milli': 500 with num_gpu=2"),
        ("p,1000,1,1,0,\n", r"row 2, column 'gpu_milli': a pod with num_gpu=1 needs"),
        ("p,1000,1,-1,0,\n", r"row 2, column 'num_gpu': -1 must be between 0 and 64"),
    ],
)
def test_bad_pod_rows_name_row_and_column(tmp_path: Path, row: str, expected: str) -> None:
    f = tmp_path / "pods.csv"
    f.write_text(HEADER + row)
    with pytest.raises(TraceError, match=expected):
        load_pods(f)


def test_missing_column_is_named(tmp_path: Path) -> None:
    f = tmp_path / "nodes.csv"
    f.write_text("sn,cpu_milli,gpu,model\nn0,1000,1,T4\n")
    with pytest.raises(TraceError, match=r"row 1 \(header\): missing column\(s\) memory_mib"):
        load_nodes(f)


def test_error_on_a_later_row_counts_the_header(tmp_path: Path) -> None:
    f = tmp_path / "nodes.csv"
    f.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,1000,1,1,T4\nn1,1000,1,2,\n")
    with pytest.raises(TraceError, match=r"row 3, column 'model': a node with GPUs needs a model"):
        load_nodes(f)


def test_duplicate_node_names_are_rejected(tmp_path: Path) -> None:
    f = tmp_path / "nodes.csv"
    f.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,1000,1,1,T4\nn0,1000,1,1,T4\n")
    with pytest.raises(TraceError, match="duplicate node name 'n0'"):
        load_nodes(f)


def test_own_yaml_format(tmp_path: Path) -> None:
    f = tmp_path / "cluster.yaml"
    f.write_text(
        """
nodes:
  - {name: a100, count: 3, cpu: 64, memory: 512Gi, gpus: 8, gpu_model: A100, gpu_memory: 80Gi}
pods:
  - {name: train, count: 2, cpu: "8", memory: 32Gi, gpus: 4}
  - {name: notebook, cpu: 500m, memory: 4Gi, gpus: 1, gpu_memory: 20Gi, gpu_models: [A100, H100]}
  - {name: share, cpu: 1, gpus: 1, gpu_share: 250}
"""
    )
    nodes = load_nodes(f)
    assert [n.name for n in nodes] == ["a100-0", "a100-1", "a100-2"]
    assert nodes[0].cpu_milli == 64_000 and nodes[0].gpu_memory_bytes == 80 * GIB
    pods = load_pods(f)
    assert [p.name for p in pods] == ["train-0", "train-1", "notebook", "share"]
    nb = pods[2].request()
    assert nb.shared and nb.memory_bytes == 20 * GIB and nb.models == frozenset({"A100", "H100"})
    assert pods[3].request().milli == 250


def test_own_yaml_errors_name_the_item(tmp_path: Path) -> None:
    f = tmp_path / "cluster.yaml"
    f.write_text("pods:\n  - {name: ok, cpu: 1, gpus: 1}\n  - {name: bad, cpu: lots, gpus: 1}\n")
    with pytest.raises(TraceError, match=r"pods\[1\], column 'cpu': 'lots' is not a quantity"):
        load_pods(f)


def test_own_csv_format(tmp_path: Path) -> None:
    f = tmp_path / "pods.csv"
    f.write_text("name,count,cpu,memory,gpus,gpu_share\nsmall,3,1,1Gi,1,300\nbig,1,8,8Gi,2,\n")
    pods = load_pods(f)
    assert len(pods) == 4 and pods[0].gpu_milli == 300 and pods[3].num_gpu == 2
    f.write_text("name,count,cpu,memory,gpus,gpu_share\nbad,1,1,1Gi,2,300\n")
    with pytest.raises(TraceError, match=r"row 2, column 'gpu_share': a GPU share needs gpus: 1"):
        load_pods(f)


def test_unreadable_and_empty_inputs(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read"):
        load_nodes(tmp_path / "missing.csv")
    f = tmp_path / "pods.csv"
    f.write_text(HEADER)
    with pytest.raises(TraceError, match="no pods"):
        load_pods(f)


#: The header of the public openb_pod_list_multigpu*.csv files (alibaba/clusterdata, cluster-trace-gpu-v2023): no
#: gpu_spec column.
MULTIGPU_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,qos,pod_phase,creation_time,deletion_time,scheduled_time"


def test_openb_pods_without_gpu_spec_column_take_any_model(tmp_path: Path) -> None:
    f = tmp_path / "openb_pod_list_multigpu50.csv"
    f.write_text(f"{MULTIGPU_HEADER}\nopenb-pod-0000,12000,16384,2,1000,LS,Running,0,12537496,0\n")
    (pod,) = load_pods(f)
    assert (pod.num_gpu, pod.gpu_milli, pod.gpu_spec) == (2, 1000, None)
    assert pod.request().models is None


def test_every_shared_openb_pod_file_loads(traces_dir: Path) -> None:
    files = sorted(traces_dir.glob("openb_pod_list_*.csv"))
    assert files, f"no openb pod lists in {traces_dir}"
    for f in files:
        assert load_pods(f), f


def test_a_trace_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    f = tmp_path / "pods.csv"
    f.write_bytes(f"{MULTIGPU_HEADER}\nn\xe9,1,1,1,1000,LS,Running,0,1,0\n".encode("latin-1"))
    with pytest.raises(TraceError, match=r"trace file .*pods.csv: not UTF-8 text \(byte 0xe9 at offset 102\)"):
        load_pods(f)


def test_known_gpu_models_get_their_memory_and_l4_has_24_gib(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(
        "nodes:\n"
        "  - {name: l4, count: 2, cpu: 32, memory: 256Gi, gpus: 4, gpu_model: L4}\n"
        "  - {name: nv, cpu: 32, memory: 256Gi, gpus: 1, gpu_model: NVIDIA L4}\n"
        "  - {name: a40, cpu: 32, memory: 256Gi, gpus: 1, gpu_model: A100-SXM4-40GB}\n"
    )
    nodes = build_fleet(load_nodes(f))
    assert nodes.mem_total[nodes.gpu_present].tolist() == [24 * GIB] * 9 + [40 * GIB]


@pytest.mark.parametrize(
    ("name", "text", "where"),
    [
        (
            "c.yaml",
            "nodes:\n  - {name: ok, cpu: 8, memory: 8Gi, gpus: 1, gpu_model: T4}\n"
            "  - {name: x, cpu: 8, memory: 8Gi, gpus: 2, gpu_model: X9}\n",
            "nodes[1], column 'gpu_model'",
        ),
        ("c.csv", "name,count,cpu,memory,gpus,gpu_model\nx,1,8,8Gi,2,X9\n", "row 2, column 'gpu_model'"),
        ("n.csv", "sn,cpu_milli,memory_mib,gpu,model\nok,8000,8192,1,T4\nx,8000,8192,2,X9\n", "row 3, column 'model'"),
    ],
)
def test_a_gpu_model_of_unknown_memory_is_refused(tmp_path: Path, name: str, text: str, where: str) -> None:
    """Before: silently 32 GiB per GPU. Now the file must say (``gpu_memory``), and with it the model is accepted."""
    f = tmp_path / name
    f.write_text(text)
    with pytest.raises(TraceError) as exc:
        load_nodes(f)
    msg = str(exc.value)
    assert msg.startswith(f"{f}: {where}: GPU model 'X9' is not one kelvin knows the memory of")
    assert "'gpu_memory'" in msg
    given = text.replace("gpu_model: X9}", "gpu_model: X9, gpu_memory: 48Gi}")
    given = given.replace("gpu_model\nx,1,8,8Gi,2,X9", "gpu_model,gpu_memory\nx,1,8,8Gi,2,X9,48Gi")
    given = given.replace(
        "model\nok,8000,8192,1,T4\nx,8000,8192,2,X9", "model,gpu_memory\nok,8000,8192,1,T4,\nx,8000,8192,2,X9,48Gi"
    )
    f.write_text(given)
    assert load_nodes(f)[-1].gpu_memory_bytes == 48 * GIB


def test_gpu_less_nodes_need_no_model(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(
        "nodes:\n  - {name: cpu, cpu: 8, memory: 8Gi}\n  - {name: g, cpu: 8, memory: 8Gi, gpus: 1, gpu_model: T4}\n"
    )
    assert build_fleet(load_nodes(f)).gpu_count.tolist() == [0, 1]
