"""kelvin's operator: moves pods off hot or noisy GPU nodes and enforces per-pod GPU memory pools.

Strategies (:mod:`.strategies`) decide what should move, the planner (:mod:`.planner`) ranks and protects, and one
evictor (:mod:`.evictor`) acts. :mod:`.k8s` is the only module that talks to the Kubernetes API; :mod:`.handlers`
wires everything into kopf.
"""
