"""How many pods of ``extender_verbs.py``'s stream get other answers from two checkouts: per pod, the nodes that
passed filter, each node's prioritize score and the best-scored node.

Run it twice, once per checkout, on the same stream. ``--record FILE`` (the reference, e.g. main) answers every pod
and binds it to its own best node, writing the answers. ``--against FILE`` (the change) answers the same pods, binds
each to the node the *reference* bound it to, so that both judge every pod on the same fleet, and counts the pods
whose best node, whose scores, or whose filter answer differ.

    (cd ../main && python bench/extender_answers_diff.py --nodes 100 --record /tmp/ref.json)
    python bench/extender_answers_diff.py --nodes 100 --against /tmp/ref.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from extender_verbs import Run
from harness import go_json

from scheduler_plugin.extender.wire import dumps


def answer(run: Run, i: int, bind_to: str | None) -> dict[str, Any]:
    """Filter, prioritize and bind pod ``i`` (to ``bind_to``, else to its best-scored node); the answers."""
    p = run.pods[i]
    passed = json.loads(dumps(run.ext.filter(run.bodies[i])))["NodeNames"] or []
    hosts = json.loads(dumps(run.ext.prioritize(go_json({"Pod": p, "Nodes": None, "NodeNames": passed}))))
    scores = {h["Host"]: h["Score"] for h in hosts}
    best = max(hosts, key=lambda h: h["Score"])["Host"] if hosts else run.names[0]
    meta = p["metadata"]
    body = {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": bind_to or best}
    bound = run.loop.run_until_complete(run.ext.bind(go_json(body)))
    if bound.get("Error"):
        raise SystemExit(f"pod {i}: bind answered Error: {bound['Error']}")
    return {"passed": list(passed), "scores": scores, "best": best, "bound": bind_to or best}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--pods", type=int, default=200)
    ap.add_argument("--assumed", type=int, default=0, help="pods in the ledger before the run")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--record", type=Path, help="answer and bind to the own best node; write the answers here")
    mode.add_argument("--against", type=Path, help="answer, bind where the recorded run bound; compare with it")
    args = ap.parse_args()
    run = Run(argparse.Namespace(nodes=args.nodes, gpus=args.gpus, pods=args.pods, warmup=0, assumed=args.assumed))
    if args.record is not None:
        answers = [answer(run, i, None) for i in range(args.pods)]
        args.record.write_text(json.dumps(answers))
        print(f"recorded {len(answers)} pods into {args.record}")
        return 0
    ref: list[dict[str, Any]] = json.loads(args.against.read_text())
    if len(ref) != args.pods:
        raise SystemExit(f"--against: {len(ref)} pods recorded, --pods is {args.pods}")
    best = scores = passed = 0
    worst = 0
    for i, r in enumerate(ref):
        a = answer(run, i, r["bound"])
        passed += a["passed"] != r["passed"]
        best += a["best"] != r["best"]
        if a["scores"] != r["scores"]:
            scores += 1
            worst = max(worst, max(abs(a["scores"].get(h, 0) - s) for h, s in r["scores"].items()))
    print(
        f"{args.pods} pods on {args.nodes} nodes x {args.gpus} GPUs: other best node {best}, other scores {scores} "
        f"(largest difference {worst} of 10), other filter answer {passed}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
