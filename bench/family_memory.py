"""Loading memory by family: each published model's parts at full size, counted on the meta device (what the door
plans with, ``models.families``), then materialized one part at a time in bfloat16 with random values in a forked
child whose peak resident memory is measured. A part larger than ``--max-gib`` is counted and not materialized
(this machine's memory: Flux.1's transformer is 22 GiB in bfloat16).

    python bench/family_memory.py [--max-gib 10]     # minutes; up to --max-gib of RAM at a time
    python bench/family_memory.py --smoke            # the parts under 0.3 GiB, for seconds
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import resource

from _common import RUN, parse_args, report

GIB = 2**30


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _materialize(part, queue) -> None:
    """In a child: the part built on the meta device, cast to bfloat16, given storage and random values; the
    growth of this process's peak resident memory over its start."""
    import torch

    from models.families import build_on_meta

    start = _rss_bytes()
    model = build_on_meta(part).to(torch.bfloat16).to_empty(device="cpu")
    with torch.no_grad():
        for tensor in (*model.parameters(), *model.buffers()):
            tensor.normal_() if tensor.is_floating_point() else tensor.zero_()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    queue.put(peak - start)


def measured_bytes(part) -> int:
    fork = multiprocessing.get_context("fork")
    queue = fork.Queue()
    child = fork.Process(target=_materialize, args=(part, queue))
    child.start()
    grown = queue.get()
    child.join()
    return grown


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-gib", type=float, default=10.0, help="materialize only parts up to this size in bfloat16")
    args = parse_args(ap, smoke={"max_gib": 0.3})
    import diffusers  # noqa: F401 - imported once, before the children fork
    import transformers  # noqa: F401

    from models.families import FAMILIES, parameter_counts

    measured, rows = {}, []
    for family in FAMILIES:
        for variant in family.variants:
            counts = parameter_counts(variant)
            parts = []
            for name, part in variant.parts.items():
                planned = counts[name] * 2  # bfloat16
                key = json.dumps([part.cls, part.config], sort_keys=True, default=str)
                if key not in measured and planned <= args.max_gib * GIB:
                    measured[key] = measured_bytes(part)
                got = measured.get(key)
                parts.append({"part": name, "parameters": counts[name], "planned_gib": round(planned / GIB, 3),
                              "measured_gib": None if got is None else round(got / GIB, 3),
                              "measured_over_planned": None if got is None else round(got / planned, 3)})
            rows.append({"family": family.name, "variant": variant.name,
                         "parameters": sum(counts.values()),
                         "planned_gib": round(sum(p["planned_gib"] for p in parts), 2), "parts": parts})
            print(f"{family.name} {variant.name}: {sum(counts.values()) / 1e9:.3f}B parameters, "
                  + ", ".join(f"{p['part']} {p['planned_gib']} GiB planned / {p['measured_gib']} measured"
                              for p in parts), flush=True)
    report("family_memory", {"max_gib": args.max_gib, "variants": rows})


if __name__ == "__main__":
    main()
