"""Print benchmarks/operator/results.json (from scale.py) as the Markdown table the README shows."""

from __future__ import annotations

import json
import sys
from pathlib import Path

DEFAULT = Path(__file__).with_name("results.json")


def main() -> int:
    results = json.loads((Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT).read_text())
    print(
        f"{results['nodes']} KWOK nodes ({', '.join(results['products'])}), Ready in {results['nodes_ready_seconds']} s; "
        f"{results['replicas_per_resource']} replica per resource; machine: {results['machine']['cpus']} CPUs, "
        f"{results['machine']['memory_gib']} GiB. Operator RSS idle: {results['operator_rss_idle_mib']} MiB; "
        f"mean reconcile: {results['reconcile_duration_mean_ms']} ms.\n"
    )
    print(
        "| resources | apply -> all Ready | probes done -> all Ready | reconciles/s "
        "| label change p50 / p99 (max) | operator RSS (peak) |"
    )
    print("|---|---|---|---|---|---|")
    for step in results["levels"]:
        reaction = step["label_change_reaction_seconds"]
        probes = step["probes_done_to_all_ready_seconds"]
        print(
            f"| {step['resources']} (+{step['new_resources']}) | {step['apply_to_all_ready_seconds']} s | "
            f"{f'{probes} s' if probes is not None else '(cached)'} | {step['reconciles_per_second']} | "
            f"{reaction['p50']} / {reaction['p99']} s ({reaction['max']} s, n={reaction['samples']}) | "
            f"{step['operator_rss_mib']} MiB ({step['operator_rss_peak_mib']} MiB) |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
