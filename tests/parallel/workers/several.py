"""msrun worker that runs several worker scripts one after the other in the same processes, so
that they share one launch (msrun's start-up, the imports, the cluster's set-up):

    msrun --worker_num=N ... several.py SCRIPT [ARG ...] :: SCRIPT [ARG ...] ...

SCRIPT is a file in this folder. Each script runs as `__main__` with its own sys.argv; the
communication is initialised once (`init_comm` creates the groups each script's layouts add, in
the same order on every rank). A script that fails ends the job with its error.
"""

import os
import runpy
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def jobs(argv):
    """[SCRIPT, ARG, ..., '::', SCRIPT, ...] -> [[SCRIPT, ARG, ...], ...]"""
    out = [[]]
    for a in argv:
        if a == "::":
            out.append([])
        else:
            out[-1].append(a)
    if any(not j for j in out):
        raise SystemExit(f"several.py: an empty job in {argv}")
    return out


for job in jobs(sys.argv[1:]):
    script = os.path.join(HERE, job[0])
    sys.argv = [script, *job[1:]]
    print(f"several.py: {' '.join(job)}", flush=True)
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:  # a script's sys.exit(0) ends that script only
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    if code:
        sys.exit(code)
