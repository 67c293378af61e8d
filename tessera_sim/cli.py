"""tessera-sim: replay a node list and a pod list through tessera's core.

The protocol is the one of Weng et al., "Beware of Fragmentation" (USENIX ATC 2023): for
each seed the pods are sorted by name and shuffled with the seed, then pods drawn from the
trace are appended until the GPU request would pass 130% of the cluster's GPUs; pods
arrive one at a time and stay; a pod that fits nowhere is dropped. The headline figure is
the GPU left unallocated when the arrived GPU request reaches 100% of the cluster's GPUs
(lower is better), as a mean and standard deviation over the seeds.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tessera.resources import DEFAULT_POLICY
from tessera_cli import exit_code
from tessera_sim.metrics import Summary
from tessera_sim.replay import TIE_RULES
from tessera_sim.runner import (
    DEFAULT_SEEDS,
    Job,
    parse_seeds,
    policy_names,
    run_jobs,
    summarize_jobs,
)
from tessera_sim.trace import TraceError, load_nodes, load_pods


def build_parser() -> argparse.ArgumentParser:
    names = policy_names()
    parser = argparse.ArgumentParser(
        prog="tessera-sim",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "policies: "
            + ", ".join(names)
            + f" (default: {DEFAULT_POLICY}, tessera's own; random, dotprod, bestfit and fgd "
            "are the paper's baselines)\n\nexample:\n  tessera-sim --nodes "
            "openb_node_list_gpu_node.csv --pods openb_pod_list_default.csv "
            "--policy fgd --policy fragmentation --seeds 42-44 --json"
        ),
    )
    parser.add_argument("--nodes", required=True, type=Path, help="node list CSV (openb format)")
    parser.add_argument(
        "--pods", required=True, type=Path, action="append", help="pod list CSV; repeatable"
    )
    parser.add_argument(
        "--policy",
        action="append",
        default=[],
        help=f"policy name, repeatable or comma-separated (default: {DEFAULT_POLICY})",
    )
    parser.add_argument(
        "--seeds",
        default=f"{DEFAULT_SEEDS[0]}-{DEFAULT_SEEDS[-1]}",
        help="seeds: a range (42-51), a list (42,43) or both (default: %(default)s)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object per policy and trace"
    )
    parser.add_argument(
        "--gpu-memory",
        choices=("share", "absolute"),
        default="share",
        help="share: a share covers compute and memory (the paper); absolute: compute share "
        "plus a fixed GPU memory request, the share of the most common GPU's memory "
        "(the memory extension)",
    )
    parser.add_argument(
        "--ties",
        choices=TIE_RULES,
        default="order",
        help="equal node scores: the first node in an order drawn per seed (the paper's "
        "simulator; default), the first by name, or a random one (kube-scheduler)",
    )
    parser.add_argument(
        "--gpuspec",
        type=int,
        action="append",
        default=[],
        metavar="PCT",
        help="also replay each pod list with PCT percent of its GPU pods limited to GPU "
        "models, as the paper's gpuspec variants (repeatable; 0 = as given)",
    )
    parser.add_argument(
        "--cpu",
        type=int,
        action="append",
        default=[],
        metavar="PCT",
        help="also replay each pod list with its CPU-only pods' CPU request at PCT percent "
        "(CPU-only pods drawn again from the trace; repeatable; 0 = as given)",
    )
    parser.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    return parser


def _policies(raw: list[str]) -> list[str]:
    names: list[str] = []
    for item in raw or [DEFAULT_POLICY]:
        names.extend(n.strip() for n in item.split(",") if n.strip())
    return list(dict.fromkeys(names))


def format_table(summaries: list[Summary]) -> str:
    rows = [
        (
            s.trace,
            s.policy,
            f"{s.unallocated_at_100.mean:.2f} ± {s.unallocated_at_100.sd:.2f}",
            f"{s.fragmentation_at_80.mean:.1f}",
            str(len(s.seeds)),
            f"{sum(s.seconds) / len(s.seconds):.1f}",
        )
        for s in summaries
    ]
    header = ("trace", "policy", "unallocated GPU % @100%", "frag % @80%", "seeds", "s/seed")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    known = set(policy_names())
    policies = _policies(args.policy)
    unknown = [p for p in policies if p not in known]
    if unknown:
        parser.error(f"unknown policy {unknown[0]!r} (one of {', '.join(policy_names())})")
    try:
        seeds = parse_seeds(args.seeds)
    except ValueError as exc:
        parser.error(f"--seeds: {exc}")
    try:
        load_nodes(args.nodes)
        for pods in args.pods:
            load_pods(pods)
    except TraceError as exc:
        print(f"tessera-sim: {exc}", file=sys.stderr)
        return exit_code(exc)
    specs = args.gpuspec or [0]
    if any(not 0 <= g <= 100 for g in specs):
        parser.error("--gpuspec: a percentage within 0..100")
    cpus = args.cpu or [0]
    if any(c < 0 for c in cpus):
        parser.error("--cpu: a percentage >= 0")
    jobs = [
        Job(str(args.nodes), str(pods), policy, seed, args.gpu_memory, args.ties, spec, cpu)
        for pods in args.pods
        for cpu in cpus
        for spec in specs
        for policy in policies
        for seed in seeds
    ]

    def done(job: Job, run: object) -> None:
        if not args.json:
            print(
                f"  {job.trace} {job.policy} seed {job.seed} done",
                file=sys.stderr,
                flush=True,
            )

    summaries = summarize_jobs(run_jobs(jobs, args.workers, done))
    order = {(job.trace, job.policy): i for i, job in reversed(list(enumerate(jobs)))}
    summaries.sort(key=lambda s: order[(s.trace, s.policy)])
    if args.json:
        for s in summaries:
            print(json.dumps(s.to_json()))
    else:
        print(format_table(summaries))
    return 0


if __name__ == "__main__":
    sys.exit(main())
