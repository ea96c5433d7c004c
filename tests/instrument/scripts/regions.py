"""A training-free rank for the tests: user regions named by ``--names`` (JSON list), nested
inside an outer region, ``--repeat`` times, with ``--sleep`` seconds in each."""

import argparse
import json
import time

from instrument import region

p = argparse.ArgumentParser()
p.add_argument("--names", default='["work"]')
p.add_argument("--repeat", type=int, default=3)
p.add_argument("--sleep", type=float, default=0.001)
args = p.parse_args()
for _ in range(args.repeat):
    with region("outer"):
        for name in json.loads(args.names):
            with region(name):
                time.sleep(args.sleep)
print("done", flush=True)
