"""The value meeting of generate_config.placement separate (parallel/separate.Meeting.value): what the rollout rank's
conversations give besides the tokens (the prompts, the reward columns, the metrics) arrives whole on the training
rank. Two threads stand in for the two ranks, summing through a host-side stand-in for the world's AllReduce (float32
on the wire, as Comm.host_sum)."""

import threading

import numpy as np

from mindgrpo.parallel.separate import Meeting


class ThreadWorld:
    """Comm's world of two ranks for two threads: host_sum adds both threads' arrays in float32."""

    world = 2

    def __init__(self):
        self.barrier = threading.Barrier(2)
        self.parts = {}

    def group(self, ranks):
        return tuple(ranks)

    def host_sum(self, values, group):
        values = np.asarray(values)
        self.parts[threading.get_ident()] = values.astype(np.float32)
        self.barrier.wait()
        total = sum(self.parts.values())
        self.barrier.wait()
        return total.reshape(values.shape).astype(values.dtype)


def test_the_value_meeting_brings_the_rollout_ranks_conversation_values_whole():
    world = ThreadWorld()
    meeting = Meeting(world, bucket_bytes=1 << 20)
    value = ([[1, 2, 3], [4, 5]],
             {"tool_calls": [[{"name": "calculator", "arguments": {"expression": "1+2"}, "status": "ok",
                               "response": "3"}], []],
              "messages": [[{"role": "assistant", "content": "é ü \x00 " + "x" * 5000}], []]},
             {"tool/calls_mean": 0.5, "tool/seconds": 0.1 + 0.2, "turns/masked_fraction": 1 / 3})
    got = {}
    rollout = threading.Thread(target=lambda: got.setdefault("rollout", meeting.value(value)))
    rollout.start()
    got["train"] = meeting.value(None)  # the training rank gives nothing
    rollout.join()
    assert got["train"] == value and got["rollout"] == value
    assert got["train"][2]["tool/seconds"] == 0.1 + 0.2  # floats bit for bit, tuples stay tuples
    assert isinstance(got["train"], tuple)
