import sys

from benchmarks.grpo_step.run import main

if __name__ == "__main__":  # spawned workers import this module under another name
    sys.exit(main())
