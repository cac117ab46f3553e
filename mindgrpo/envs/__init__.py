"""Multi-turn environments: a registry of tasks that answer the model's turns (`reset(prompt) -> observation`,
`step(model_turn) -> observation, reward, done`), run as user code in the tool workers.

    from mindgrpo.envs import Environment, register_environment, load_environment_plugin, environment_pool

Built-in example: guess_number (mindgrpo/envs/guess_number.py). The engine side: mindgrpo/inference/env_turns.py.
The manual: docs/tools.md, "Environments".
"""

from mindgrpo.envs import guess_number  # noqa: F401  (registers the example)
from mindgrpo.envs.driver import DRIVER, environment_pool, reset_call, reset_result, step_call, step_result
from mindgrpo.envs.registry import (
    ENVIRONMENTS,
    Environment,
    check_environment_settings,
    environment_settings,
    load_environment_plugin,
    make_environment,
    register_environment,
)

__all__ = [
    "DRIVER", "ENVIRONMENTS", "Environment", "check_environment_settings", "environment_pool", "environment_settings",
    "load_environment_plugin", "make_environment", "register_environment", "reset_call", "reset_result",
    "step_call", "step_result",
]
