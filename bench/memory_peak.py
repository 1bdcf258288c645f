"""What is live on the GPU at its peak: reads a CUDA allocator snapshot (``gpu_grpo.py --memory-history N``) and
prints the peak of allocated memory over its trace and the allocations live then, grouped by where they were made.

Usage::

    python bench/memory_peak.py bench-out/memory_bare.pickle [--top 20] [--frames 4]

The trace only holds what was allocated after recording began (the bench starts it before a variant loads its
model) and its last N events: if it overflowed, earlier allocations are missing and the peak is a lower bound.
"""

import argparse
import pickle
from collections import defaultdict

GIB = 2**30
SKIP = ("torch/", "contextlib.py", "functools.py", "threading.py")  # Python frames that say nothing of the caller


def where(frames: list[dict], depth: int) -> str:
    """The first ``depth`` frames of an allocation's Python stack that are not torch's own plumbing."""
    kept = [f"{f['filename'].rsplit('site-packages/', 1)[-1].rsplit('gpu-site/', 1)[-1]}:{f['line']} {f['name']}"
            for f in frames if f["filename"].endswith(".py") and not any(skip in f["filename"] for skip in SKIP)]
    return " < ".join(kept[:depth]) or "(no Python frame)"


def replay(trace: list[dict], until: int | None = None):
    """Replay allocs and frees up to event ``until`` (all by default): (peak bytes, its event, live allocations)."""
    live, total, best, best_at = {}, 0, -1, -1
    for i, event in enumerate(trace[:None if until is None else until + 1]):
        if event["action"] == "alloc":
            live[event["addr"]] = event
            total += event["size"]
        elif event["action"] == "free_completed" and event["addr"] in live:
            total -= live.pop(event["addr"])["size"]
        if total > best:
            best, best_at = total, i
    return best, best_at, live


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("snapshot")
    parser.add_argument("--top", type=int, default=20, help="how many groups to print")
    parser.add_argument("--frames", type=int, default=4, help="frames that name a group")
    args = parser.parse_args(argv)
    with open(args.snapshot, "rb") as file:
        trace = pickle.load(file)["device_traces"][0]
    if not trace:
        raise SystemExit("the snapshot holds no trace: record with torch.cuda.memory._record_memory_history()")
    best, at, _ = replay(trace)
    live = replay(trace, at)[2]
    groups = defaultdict(lambda: [0, 0])
    for event in live.values():
        group = groups[where(event.get("frames", []), args.frames)]
        group[0], group[1] = group[0] + event["size"], group[1] + 1
    print(f"{len(trace)} events; peak allocated {best / GIB:.2f} GiB at event {at} "
          f"({(trace[at]['time_us'] - trace[0]['time_us']) / 1e6:.1f} s in), {len(live)} allocations live:")
    for place, (size, count) in sorted(groups.items(), key=lambda item: -item[1][0])[:args.top]:
        print(f"{size / GIB:7.3f} GiB {count:6d}x  {place}")
    print("the largest single allocations:")
    for event in sorted(live.values(), key=lambda event: -event["size"])[:args.top // 2]:
        print(f"{event['size'] / GIB:7.3f} GiB  {where(event.get('frames', []), args.frames)}")


if __name__ == "__main__":
    main()
