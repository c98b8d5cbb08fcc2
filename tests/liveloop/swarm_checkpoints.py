"""Offline measurement (not a test): every checkpoint of a finished swarm demo on the same held-out tasks.

The demo's verdict measures two checkpoints held out, the base and the one it judges (:mod:`liveloop.demo.held_out`).
This measures every checkpoint the learner wrote (``learner/checkpoints`` in the demo's ``--state-dir``, promoted
or not) the same way, to see what each cycle learned::

    PYTHONPATH=. DS_ACCELERATOR=cpu .venv/bin/python -m tests.liveloop.swarm_checkpoints /tmp/demo-state --tasks 400

What it found is in docs/swarm-learnability.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from liveloop.demo.held_out import HELD_OUT_TASKS, swarm_held_out

FIGURES = (
    "success",
    "critical_steps_many_parts",
    "parallel_share_many_parts",
    "parallel_share_one_part",
    "serial_collapse",
    "fake_parallelism",
    "garbled",
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("state_dir", type=Path, help="The demo's --state-dir.")
    ap.add_argument("--tasks", type=int, default=HELD_OUT_TASKS)
    a = ap.parse_args()
    torch.set_num_threads(1)
    for folder in sorted((a.state_dir / "learner" / "checkpoints").iterdir()):
        figures = swarm_held_out(folder, a.tasks)
        print(folder.name, flush=True)
        for name in FIGURES:
            raw = figures[name]
            value = raw.get("rate", raw.get("mean"))
            print(f"  {name}: {value:.3f} ({raw['low']:.3f}-{raw['high']:.3f}, n {raw['n']})", flush=True)


if __name__ == "__main__":
    main()
