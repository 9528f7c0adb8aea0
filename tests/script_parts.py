"""One subprocess for several tests: a script whose parts (functions) run in turn, each part's result, or its
traceback, under its own key of the JSON line it prints, so a part that raises fails only the tests that read it
(tests/test_engine.py's 8-device runs, tests/test_aot.py's libtpu compiles)."""


def tail(parts: dict[str, str]) -> str:
  """Script text that calls each function named in {key: function name} in turn and prints one JSON line
  {key: its result, or {"error": its traceback}}."""
  calls = "".join(f"({key!r}, {fn}), " for key, fn in parts.items())
  return f"""
import json as _json, traceback as _traceback
_out = {{}}
for _key, _part in ({calls}):
  try:
    _out[_key] = _part()
  except Exception:
    _out[_key] = {{"error": _traceback.format_exc()[-3000:]}}
print(_json.dumps(_out))
"""


def part(results: dict, key: str) -> dict:
  """`key`'s result; fails with the part's traceback where it raised."""
  r = results[key]
  assert "error" not in r, r.get("error")
  return r
