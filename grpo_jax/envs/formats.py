"""How a tool call and its observation are written (`tools.format`), and the stop markers that pause a row.

- `plain` (the shipped tokenizer's, for the synthetic tasks; `task.tokenizer='tools'` has the markers as pieces):
  the model writes `<tool_call> 37 + 48 </tool_call>`, the row pauses on `</tool_call>`, the observation
  ` <tool_response> 85 </tool_response>` is appended (whitespace runs in it collapsed to one space: the shipped
  tokenizer has no newline; tool markers and the task's <think> / <answer> tags in the output removed), and the
  model continues. One argument per tool, written whole between the markers.
- `qwen` (Qwen2.5-Instruct's chat format, HF tokenizers): the prompt is the chat template rendered with
  `tools=[schema]`; the model writes `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` and pauses on
  `</tool_call>`; the observation is what the template renders after that assistant turn for one `tool` message and
  the generation prompt (`<|im_end|>\\n<|im_start|>user\\n<tool_response>\\n…\\n</tool_response><|im_end|>\\n
  <|im_start|>assistant\\n`), so prompt + turns + observations is, character for character, transformers'
  `apply_chat_template(messages, tools=...)` of the conversation (tests/test_envs.py). One call per turn: the row
  pauses on the first `</tool_call>` (Qwen's parallel calls, several blocks in one turn, are not supported). A
  tool's output that holds a token's string (`<|im_end|>`, ...) is encoded as text (`Qwen.observation_ids`).

Both observations begin and end at a marker or a special token that the tokenizer splits on, so an observation
tokenised alone joins the transcript as the whole text would tokenise.
"""
from __future__ import annotations

import abc
import dataclasses
import json
from typing import NamedTuple, Sequence

from grpo_jax.tasks import base as task_base
from grpo_jax.tasks import prompts
from grpo_jax.tasks import tokenizer as tokenizer_lib

CALL_OPEN, CALL_CLOSE, RESPONSE_OPEN, RESPONSE_CLOSE = tokenizer_lib.TOOL_MARKERS


@dataclasses.dataclass(frozen=True)
class Tool:
  """One tool an environment offers: its name, what it does, and its one argument (a string)."""
  name: str
  description: str
  arg: str
  arg_description: str

  def schema(self) -> dict:
    """The OpenAI / transformers function schema that Qwen's template lists inside <tools></tools>."""
    return {"type": "function", "function": {
        "name": self.name, "description": self.description,
        "parameters": {"type": "object", "properties": {self.arg: {"type": "string",
                                                                   "description": self.arg_description}},
                       "required": [self.arg]}}}


class ToolCall(NamedTuple):
  name: str
  arguments: dict


class Parsed(NamedTuple):
  """What a turn's text asked for: a call, an error to report back to the model, or (both empty) no call at all."""
  call: ToolCall | None
  error: str = ""


def _last_block(text: str) -> tuple[str | None, str]:
  """(content of the last <tool_call> … </tool_call> block that ends the text, error); (None, '') if the text does not
  end with </tool_call>."""
  body = text.rstrip()
  if not body.endswith(CALL_CLOSE):
    return None, ""
  body = body[:-len(CALL_CLOSE)]
  start = body.rfind(CALL_OPEN)
  if start < 0:
    return None, "a call closed that was never opened"
  return body[start + len(CALL_OPEN):], ""


class Format(abc.ABC):
  """Writes calls and observations, reads calls back from a turn's text, and renders the prompt with the tools."""
  name: str
  # The text every observation ends with (truncation keeps it, so a cut observation still closes).
  tail: str

  @abc.abstractmethod
  def call_text(self, tool: Tool, value: str) -> str:
    """What the model writes to call `tool` with `value` (pre-training documents, tests)."""

  @abc.abstractmethod
  def parse(self, text: str, tools: Sequence[Tool]) -> Parsed:
    """The call a turn's text (everything the model wrote since the last observation) ends with."""

  @abc.abstractmethod
  def observation(self, content: str) -> str:
    """The text appended to the transcript for a tool's output `content`."""

  @abc.abstractmethod
  def prompt(self, task, example: dict, language: str, tok, tools: Sequence[Tool]) -> str:
    """The prompt text of `example` with the tools offered."""

  @abc.abstractmethod
  def prompt_ids(self, text: str, tok) -> list[int]:
    """The prompt's token ids (with the bos the format's prompts start with)."""

  def observation_ids(self, text: str, tok) -> list[int]:
    """The token ids an observation's text is appended as (EnvBatch)."""
    return tok.encode(text)

  @abc.abstractmethod
  def frame(self, tok) -> int:
    """Tokens of `tok` that an observation's own markers take (tools.max_obs_tokens must exceed them)."""


class Plain(Format):
  name = "plain"
  tail = f" {RESPONSE_CLOSE}"

  def call_text(self, tool: Tool, value: str) -> str:
    del tool
    return f"{CALL_OPEN} {value} {CALL_CLOSE}"

  def parse(self, text: str, tools: Sequence[Tool]) -> Parsed:
    content, err = _last_block(text)
    if content is None:
      return Parsed(None, err)
    if len(tools) != 1:
      return Parsed(None, f"the plain format names no tool; it serves environments with one tool, not {len(tools)}")
    return Parsed(ToolCall(tools[0].name, {tools[0].arg: content.strip()}))

  def observation(self, content: str) -> str:
    body = str(content)
    # the tool's output must not close (or open) a block itself, in what the model reads: a `</tool_response>`
    # would end the observation early and the rest read as the model's own turn, an `<answer>` as an answer begun.
    # The verifiers need no stripping: they read the model's own tokens only (obs_mask.own_tokens)
    for m in tokenizer_lib.TOOL_MARKERS + tokenizer_lib.TAGS:
      body = body.replace(m, " ")
    body = " ".join(body.split())
    return f" {RESPONSE_OPEN} {body} {RESPONSE_CLOSE}" if body else f" {RESPONSE_OPEN} {RESPONSE_CLOSE}"

  def frame(self, tok) -> int:
    return len(tok.encode(f" {RESPONSE_OPEN}")) + len(tok.encode(self.tail))

  def prompt(self, task, example: dict, language: str, tok, tools: Sequence[Tool]) -> str:
    del tok, tools  # the base learnt the calls from its pre-training documents: the R1-Zero prompt as it is
    return task_base.prompt(task, example, language)

  def prompt_ids(self, text: str, tok) -> list[int]:
    return [tok.bos_id] + tok.encode(text)


class Qwen(Format):
  name = "qwen"
  head = f"<|im_end|>\n<|im_start|>user\n{RESPONSE_OPEN}\n"
  tail = f"\n{RESPONSE_CLOSE}<|im_end|>\n<|im_start|>assistant\n"
  control = ("<|im_start|>", "<|im_end|>")  # written as single tokens: the tokenizer must have them

  def call_text(self, tool: Tool, value: str) -> str:
    # The template writes '{"name": "' + name + '", "arguments": ' + tojson(arguments) + '}': json.dumps' spacing.
    return f"{CALL_OPEN}\n{json.dumps({'name': tool.name, 'arguments': {tool.arg: value}}, ensure_ascii=False)}\n" \
           f"{CALL_CLOSE}"

  def parse(self, text: str, tools: Sequence[Tool]) -> Parsed:
    content, err = _last_block(text)
    if content is None:
      return Parsed(None, err)
    try:
      obj = json.loads(content)
    except json.JSONDecodeError as e:
      return Parsed(None, f"the tool call is not JSON ({e.msg} at char {e.pos})")
    except RecursionError:  # '[[[[…' from the model: an error observation, not a failed step
      return Parsed(None, "the tool call is nested too deeply")
    except ValueError as e:  # an integer of more than 4,300 digits (Python's int conversion limit): likewise
      return Parsed(None, f"the tool call cannot be read ({str(e).split(';')[0]})")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
      return Parsed(None, 'the tool call must be {"name": <function-name>, "arguments": <args-json-object>}')
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models write the arguments as a JSON string
      try:
        args = json.loads(args)
      except (ValueError, RecursionError):  # JSONDecodeError, or an int past the conversion limit
        return Parsed(None, "the tool call's arguments are not a JSON object")
    by_name = {t.name: t for t in tools}
    tool = by_name.get(obj["name"])
    if tool is None:
      return Parsed(None, f"unknown tool {obj['name']!r}; use {sorted(by_name)}")
    if not isinstance(args, dict) or not isinstance(args.get(tool.arg), str):
      return Parsed(None, f"{tool.name} takes {{{json.dumps(tool.arg)}: <string>}}")
    return Parsed(ToolCall(tool.name, args))

  def observation(self, content: str) -> str:
    return f"{self.head}{content}{self.tail}"

  def frame(self, tok) -> int:
    return len(tok.encode(self.head)) + len(tok.encode(self.tail))

  def observation_ids(self, text: str, tok) -> list[int]:
    """The whole text's ids, unless the tool's output (between head and tail) holds an added token's string
    (`<|im_end|>`, `<|im_start|>`, `</tool_call>`, ...): then that output is encoded as plain text
    (tok.encode_text), so a tool cannot end its turn, open another, or speak as the assistant; the format's own
    head and tail stay control tokens."""
    as_text = getattr(tok, "encode_text", None)
    if as_text is None or not (text.startswith(self.head) and text.endswith(self.tail)
                               and len(text) >= len(self.head) + len(self.tail)):
      return tok.encode(text)
    content = text[len(self.head):len(text) - len(self.tail)]
    plain = as_text(content)
    if plain == tok.encode(content):  # no token strings in it: the whole text's ids, as the template's tokenise
      return tok.encode(text)
    return tok.encode(self.head) + plain + tok.encode(self.tail)

  def prompt(self, task, example: dict, language: str, tok, tools: Sequence[Tool]) -> str:
    return prompts.chat_text(task, example, language, tok, [t.schema() for t in tools])

  def prompt_ids(self, text: str, tok) -> list[int]:
    return tok.encode(text)  # the template writes any bos itself (Qwen's has none)


FORMATS: dict[str, Format] = {f.name: f for f in (Plain(), Qwen())}


def env_tools(env) -> tuple:
  """The tools an environment offers (a ToolEnv's `tool`, else its `tools` sequence of Tool): what the qwen
  format's prompts list in the chat template's <tools> (validate_tools checks each is a Tool)."""
  one = getattr(env, "tool", None)
  return (one,) if one is not None else tuple(getattr(env, "tools", None) or ())


def get(name: str) -> Format:
  if name not in FORMATS:
    raise ValueError(f"tools.format={name!r} is unknown; use one of {sorted(FORMATS)}.")
  return FORMATS[name]


def stop_ids(tok, markers: Sequence[str]) -> tuple[int, ...]:
  """Each stop marker's token id: a row pauses for the environment when it emits one (compared per decode step, like
  the EOS ids, so each marker must be exactly one token of `tok`). One-line ValueError naming the key otherwise."""
  if isinstance(markers, str) or not markers:
    raise ValueError(f"tools.stop_markers={markers!r} must be a non-empty tuple of strings, e.g. ('{CALL_CLOSE}',).")
  out = []
  for m in markers:
    if not isinstance(m, str) or not m:
      raise ValueError(f"tools.stop_markers: {m!r} is not a non-empty string.")
    ids = tok.encode(m)
    eos = set(getattr(tok, "eos_ids", ())) | {getattr(tok, "eos_id", -1)}
    if len(ids) == 1 and ids[0] in eos:  # EOS is checked first: rows end there, the environment is never called
      raise ValueError(f"tools.stop_markers: {m!r} is the tokenizer's end-of-sequence token (id {ids[0]}); a row ends "
                       "on it instead of pausing: use the tool-call closing marker, e.g. ('</tool_call>',).")
    if len(ids) != 1 or ids[0] == getattr(tok, "unk_id", -1) or tok.decode(ids) != m:
      pieces = [tok.decode([i]) for i in ids]
      raise ValueError(f"tools.stop_markers: {m!r} is not one token of this tokenizer (it encodes to {len(ids)}: "
                       f"{pieces}); a row stops on single tokens: use task.tokenizer='tools' (the shipped tokenizer "
                       "with the tool markers as pieces) or a marker the tokenizer has as one token.")
    out.append(ids[0])
  return tuple(out)

