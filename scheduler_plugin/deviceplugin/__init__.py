"""``kelvin device-plugin``: the kubelet device-plugin API (v1beta1) serving the GPUs kelvin's extender chose.

Modules: :mod:`.devices` (the node's GPUs and the device IDs advertised for them), :mod:`.allocation` (pure: which
pod an Allocate call is for, which GPUs and which environment it gets), :mod:`.pods` (the pod lookup through the API),
:mod:`.health` (NVML: lost GPUs and critical XIDs), :mod:`.service` (the gRPC servicer), :mod:`.plugin` (servers,
kubelet registration and re-registration), :mod:`.cli`. The protocol choices are in docs/device-plugin.md.
"""
