"""Environments the tests name by `tools.env='tests.tool_envs:<name>'` (importable from the repository root, as a
user's `module:attr` environment is): deterministic in the turn's text, so a resumed run equals an uninterrupted one."""
import os
import time

from grpo_jax.envs import base as env_base
from grpo_jax.envs import formats

# Test switches, read at every step: `sleep_s` holds each step that long (a failing or slow tool).
MODE = {"sleep_s": 0.0}
# A file the resume test creates before its run starts, holding a path (the step-2 checkpoint's directory): the first
# environment call made once that path exists writes `<gate>.in_call` and sleeps there, so a kill lands inside an
# environment call after that checkpoint. The run itself opens the gate: when the test opened it on seeing the
# checkpoint, a loaded machine let the run finish its last environment call first ("no environment call after
# step 2", seen at load 6).
GATE = "GRPO_TEST_ENV_GATE"


class Echo(env_base.Env):
  """Any turn gets the observation ' <tool_response> k </tool_response>', k = the turn's length in characters
  mod 10, and reward 1: a random model's rows call it whenever they emit one of the stop markers."""
  stateful = False

  def __init__(self, ctx: env_base.EnvContext):
    self.ctx = ctx

  def reset(self, example):
    return ""

  def step(self, state, action_text):
    if MODE["sleep_s"]:
      time.sleep(MODE["sleep_s"])
    gate = os.environ.get(GATE, "")
    if gate and os.path.exists(gate):
      with open(gate) as f:
        after = f.read().strip()
      if not after or os.path.exists(after):
        open(gate + ".in_call", "w").close()
        time.sleep(30)
    return self.ctx.format.observation(str(len(action_text) % 10)), 1.0, False, {}


class QwenEcho(env_base.ToolEnv):
  """Echo as a ToolEnv: its tool is listed in the qwen format's prompts, and any turn gets the format's observation
  of k (as Echo's), or of MODE['content'] when set (a tool's output to inject), with reward 1."""
  tool = formats.Tool("echo", "Echo the length of the call.", "text", "any text")

  def step(self, state, action_text):
    content = MODE.get("content") or str(len(action_text) % 10)
    return env_base.StepResult(self.ctx.format.observation(content), 1.0, False, {})

  def run(self, state, value):
    return value, {}
