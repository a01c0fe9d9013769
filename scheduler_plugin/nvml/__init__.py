"""NVML access shared by the exporter and the device plugin: the backend interface (the real ``pynvml`` module or
the fake), the fake NVML and its state file, and the XID event watcher."""
