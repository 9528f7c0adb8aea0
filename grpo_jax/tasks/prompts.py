"""Prompt formats (`task.prompt_format`): the token ids a question is asked with.

- 'r1_zero': bos + the task's R1-Zero plain template (base.prompt): the completion starts with `<think>`.
- 'chat': the tokenizer's own chat template (tokenizer_config.json's Jinja `chat_template`, rendered as
  transformers' apply_chat_template renders it): a system turn with the task's instruction, the user turn with the
  question, and the generation prompt. The template writes any bos itself (Llama-3's does, Qwen's has none).
"""
from __future__ import annotations

from typing import Sequence

from grpo_jax.tasks import base

FORMATS = ("r1_zero", "chat")
# The R1-Zero instruction as a system turn, for tasks that define no `chat_system` of their own.
R1_SYSTEM = ("The assistant first thinks about the reasoning process in the mind and then provides the user with the "
             "answer. The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> "
             "tags, respectively, i.e., <think> reasoning process here </think> <answer> answer here </answer>.")


def check(prompt_format: str, tok) -> None:
  """One-line ValueError if the format is unknown or the tokenizer cannot render it."""
  if prompt_format not in FORMATS:
    raise ValueError(f"task.prompt_format={prompt_format!r} is unknown; use one of {list(FORMATS)}.")
  if prompt_format == "chat" and not getattr(tok, "chat_template", None):
    where = getattr(tok, "directory", "the shipped tokenizer")
    raise ValueError(f"task.prompt_format='chat' needs a tokenizer with a chat template, but {where} has none "
                     "(tokenizer_config.json's chat_template); use an instruct checkpoint's tokenizer "
                     "(task.tokenizer=init_from) or task.prompt_format='r1_zero'.")


def messages(task, ex: dict, language: str) -> list[dict[str, str]]:
  return [{"role": "system", "content": getattr(task, "chat_system", R1_SYSTEM)},
          {"role": "user", "content": task.question(ex, language)}]


def chat_text(task, ex: dict, language: str, tok, tools: Sequence[dict] = ()) -> str:
  """The chat template's prompt text; `tools` (JSON function schemas) rendered into it as transformers'
  apply_chat_template(tools=...) does (tools.format='qwen': envs/formats.py)."""
  check("chat", tok)
  return tok.apply_chat_template(messages(task, ex, language), add_generation_prompt=True, tools=list(tools) or None)


def prompt_ids(task, ex: dict, language: str, tok, prompt_format: str = "r1_zero",
               tools: Sequence[dict] = ()) -> list[int]:
  """The prompt's ids. The task's text is encoded as transformers encodes a rendered template: a token's string in
  a question becomes that token (datasets are trusted input; a tool's output is not: formats.Qwen.observation_ids)."""
  if prompt_format == "r1_zero":
    if tools:
      raise ValueError("tools.format='qwen' lists the tools in the chat template; set task.prompt_format='chat'.")
    return [tok.bos_id] + tok.encode(base.prompt(task, ex, language))
  check(prompt_format, tok)
  return tok.encode(chat_text(task, ex, language, tok, tools))
