"""Stand-ins for the trainer's collaborators, shared by the trainer tests that drive a real trainer
without files (tests/grpo is on sys.path under pytest)."""


class RecordingLog:
    """The metrics log: keeps each step's metrics in `rows`; completions are dropped."""

    def __init__(self):
        self.rows = {}

    def log(self, step, metrics):
        self.rows[step] = dict(metrics)

    def log_completions(self, step, rows):
        pass
