"""A training-free rank for the tests: user regions named by ``--names`` (JSON list), nested
inside an outer region, ``--repeat`` times, with ``--sleep`` seconds in each.
``--abort-at-exit``: the process aborts while Python shuts down, after the script returned."""

import argparse
import atexit
import json
import os
import time

from instrument import region

p = argparse.ArgumentParser()
p.add_argument("--names", default='["work"]')
p.add_argument("--repeat", type=int, default=3)
p.add_argument("--sleep", type=float, default=0.001)
p.add_argument("--abort-at-exit", action="store_true")
args = p.parse_args()
if args.abort_at_exit:
    atexit.register(os.abort)
for _ in range(args.repeat):
    with region("outer"):
        for name in json.loads(args.names):
            with region(name):
                time.sleep(args.sleep)
print("done", flush=True)
