"""A training-free rank with real steps: ``--steps`` steps of ``--step-s`` seconds, each a
``compute`` region ended by :func:`end_step`. Prints ``started`` when the first step begins."""

import argparse
import time

from instrument.tracer.markers import end_step, region

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=3)
p.add_argument("--step-s", type=float, default=0.01)
args = p.parse_args()
for step in range(args.steps):
    with region("compute"):
        if step == 0:
            print("started", flush=True)
        time.sleep(args.step_s)
    end_step()
print("done", flush=True)
