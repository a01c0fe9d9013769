#!/usr/bin/env bash
# Run on a machine with an NVIDIA GPU (e.g. an H200 node): the gpu-marked tests (exporter, device plugin), then one
# real exporter scrape.
# Usage: bash bench/gpu_check.sh   (from the repository root, with the venv active or at .venv)
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f .venv/bin/activate ] && . .venv/bin/activate
export PYTHONPATH=".:operator${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=index,name,memory.total,temperature.gpu,power.draw --format=csv || true
python -m pytest tests/exporter/test_real_gpu.py tests/deviceplugin/test_deviceplugin_real_gpu.py -m gpu -rs -q -s
python - <<'PY'
import time
from prometheus_client import generate_latest
from scheduler_plugin.exporter.app import Exporter
from scheduler_plugin.nvml.backend import real_nvml

exp = Exporter(real_nvml(), "gpu-check", watch_xid=False)
generate_latest(exp.registry)  # first scrape initialises NVML and discovers links/topology
times = []
for _ in range(20):
    t = time.perf_counter(); text = generate_latest(exp.registry).decode(); times.append(time.perf_counter() - t)
print(text)
times.sort()
print(f"real scrape: p50 {times[10]*1e3:.2f} ms, max {times[-1]*1e3:.2f} ms over 20 scrapes")
PY
