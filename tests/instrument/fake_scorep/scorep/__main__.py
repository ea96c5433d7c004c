"""Test stand-in for ``python -m scorep``: runs the program the way the bindings' runner does."""

import json
import os
import sys


def main() -> None:
    options, program = [], []
    for arg in sys.argv[1:]:
        if program or not arg.startswith("-"):
            program.append(arg)
        else:
            options.append(arg)
    where = os.environ["SCOREP_EXPERIMENT_DIRECTORY"]
    os.makedirs(where, exist_ok=True)
    with open(os.path.join(where, "argv.json"), "w") as f:
        json.dump({"options": options, "program": program,
                   "env": {k: v for k, v in os.environ.items() if k.startswith("SCOREP_")}}, f)
    sys.argv = program
    sys.path[0] = os.path.split(program[0])[0]
    with open(program[0]) as f:
        code = compile(f.read(), program[0], "exec")
    globs = {"__file__": program[0], "__name__": "__main__", "__package__": None, "__cached__": None}
    exec(code, globs, globs)


main()
