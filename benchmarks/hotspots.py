"""Where Sluiceway's time goes in the comparison's scenarios: py-spy samples the broker while
`sluiceway bench` runs one scenario of compare.py against it.

For each scenario, writes to benchmarks/profiles/:

- SCENARIO.folded: the sampled stacks, one line per distinct stack with its count (the "folded"
  format that flamegraph.pl, speedscope and inferno read);
- SCENARIO.txt: the bench figures, then the functions by share of the broker's busy samples,
  by their own time and including what they call (waiting in epoll, and the journal's fsync
  thread, are left out: they are not the event loop's work).

    .venv/bin/python benchmarks/hotspots.py [--scenarios queue,topic,persistent-consumer]
        [--rate 250] [--scale 1.0]

Needs py-spy (`pip install -e '.[bench]'`, which ./dev bench does) and the right to trace the
broker (root, or ptrace_scope 0). The broker profiled runs its per-message path as Python source
(SLUICEWAY_PURE_PYTHON=1): py-spy sees no frames inside the compiled modules. The shares are
those of the source; the compiled build spends less in each, and not in the same proportions.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from compare import BROKERS, SCENARIOS, bench, running

from sluiceway.compiled import PURE_VARIABLE

PROFILES = Path(__file__).parent / "profiles"
# Samples that are not the event loop's work: waiting in epoll, and the journal's sync thread.
IDLE = ("Selector.select (selectors.py", "Journal._sync_loop (sluiceway/store")
TOP = 40


def summarise(folded: Path) -> str:
    """The functions with the largest shares of busy samples, own time and inclusive."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    busy = 0
    for line in folded.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        frames = [re.sub(r":\d+\)$", ")", frame) for frame in stack.split(";")]
        if any(marker in frame for frame in frames for marker in IDLE):
            continue
        count = int(count_text)
        busy += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    lines = [f"busy samples: {busy}", "", "own time:"]
    lines += [f"{100 * n / busy:5.1f} %  {f}" for f, n in own.most_common(TOP)]
    lines += ["", "including callees:"]
    lines += [f"{100 * n / busy:5.1f} %  {f}" for f, n in inclusive.most_common(TOP)]
    return "\n".join(lines) + "\n"


def profile(key: str, rate: int, scale: float, py_spy: str) -> None:
    scenario = next(s for s in SCENARIOS if s.key == key)
    broker = BROKERS["sluiceway"]
    folded = PROFILES / f"{key}.folded"
    with running(broker, scenario.properties) as pid:
        sampler = subprocess.Popen(
            # --nonblocking: read the broker's stacks without stopping it for each sample, so
            # that it runs at nearly its own speed (a sample may then be slightly torn).
            [py_spy, "record", "--pid", str(pid), "--format", "raw", "--rate", str(rate),
             "--nonblocking", "--output", str(folded)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            result = bench(scenario, broker, pid, scale)
        finally:
            sampler.send_signal(signal.SIGINT)  # py-spy writes what it sampled, then exits
            sampler.wait(60)
    figures = ", ".join(
        f"{name} {result[name]:,.0f}" for name in ("sent_per_second", "received_per_second")
    )
    command = f"sluiceway bench {' '.join(scenario.bench)}"
    header = f"{scenario.title}\n{command}\n{figures} (while sampled at {rate} Hz)\n\n"
    (PROFILES / f"{key}.txt").write_text(header + summarise(folded))
    print(f"{key}: {figures}; profiles/{key}.txt", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", default="queue,topic,persistent-consumer")
    parser.add_argument("--rate", type=int, default=250, help="samples per second")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply message counts")
    args = parser.parse_args()
    py_spy = shutil.which("py-spy", path=os.pathsep.join([str(Path(sys.executable).parent)]))
    py_spy = py_spy or shutil.which("py-spy")
    if py_spy is None:
        sys.exit("hotspots.py: py-spy is not installed (pip install -e '.[bench]')")
    PROFILES.mkdir(exist_ok=True)
    os.environ[PURE_VARIABLE] = "1"  # inherited by the broker: see the module's docstring
    for key in args.scenarios.split(","):
        profile(key, args.rate, args.scale, py_spy)


if __name__ == "__main__":
    main()
