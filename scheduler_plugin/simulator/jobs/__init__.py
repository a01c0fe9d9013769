"""Job-level simulation (``kelvin simulate --jobs``): multi-pod jobs arriving over time on a racked fleet, placed by
four schedulers (default kube-scheduler per pod, kelvin per pod, a Kueue-TAS-like greedy, kelvin's gang planner),
with a ring all-reduce network model and a poorly-cooled-nodes thermal scenario. See docs/jobs.md."""
