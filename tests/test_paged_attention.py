"""The continuous engine's paged KV store (model/paged_attention.py): the whole engine over pages gives the static
engine's samples (left pads, G 1/4, several EOS, S = N and N/2, page sizes that cut prompts at every offset), on one
device and per shard on 8 simulated devices (that test is in tests/test_engine.py, sharing its 8-device run); its
plain-JAX attention equals the TPU kernel's own eager reference; the store holds each prompt unpadded from position
0; the config key's errors and `auto`; and, through libtpu, the TPU kernel's custom call inside the decode while
loop of a TPU lowering."""
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import conftest  # tests/conftest.py: requires
from grpo_jax.model import paged_attention as PA
from grpo_jax.rollout import engine as E
from grpo_jax.rollout import sampling as S
from tests.jit_call import jit_call
from tests.test_engine import (B, L, MCFG, assert_goldens_with, assert_same, continuous, prompts, random_params,
                               reference)


@pytest.fixture(scope="module")
def params():
  return random_params(MCFG, 0)


@pytest.mark.parametrize("G,slots,page", [(4, 0, 4), (4, 8, 2), (1, 2, 8)])
def test_paged_engine_gives_the_static_engines_samples(params, G, slots, page):
  """S = N and N/2 (G = 4: 16 rows), G = 1; prompts with 0..5 left pads of P = 6, so page sizes 2 and 4 leave
  partial prompt pages of every fill (copied per slot) and 8 holds the whole prompt in its partial page; rows end
  at EOS ids early, others run to L."""
  prompt, pm = prompts(B)
  scfg = S.SamplingConfig(max_new_tokens=L, eos_id=(3, 7, 11), exit_chunk=4)
  u = S.uniforms(jax.random.PRNGKey(1), L, B * G)
  ref = reference(params, prompt, pm, G, scfg, u)
  lengths = np.asarray(ref.lengths_N)
  assert lengths.min() < L and lengths.max() == L, lengths
  ro, stats = continuous(params, prompt, pm, G, scfg, u, slots=slots, attention="paged", page_size=page)
  assert_same(ro, ref)
  # the plain layout's schedule (admission, refill, compaction; engine.simulate replays it): only the KV store differs
  n = B * G
  sim = E.simulate(lengths, slots or n, E.compaction_sizes(slots or n, 4), 4, L)
  assert (int(ro.decode_steps), int(stats.row_steps)) == (sim["steps"], sim["row_steps"])


def test_paged_engine_with_compaction_and_teacher_forcing(params):
  """A long-tailed batch through 4 compaction sizes (the slots' own pages move with them) and, with the static
  tokens forced, the static log-probs."""
  prompt, pm = prompts(8, seed=1)
  G, n = 4, 32
  scfg = S.SamplingConfig(max_new_tokens=L, eos_id=tuple(range(1, 40)))
  u = S.uniforms(jax.random.PRNGKey(7), L, n)
  ref = reference(params, prompt, pm, G, scfg, u)
  ro, stats = continuous(params, prompt, pm, G, scfg, u, levels=4, attention="paged", page_size=4)
  assert_same(ro, ref)
  assert int(stats.row_steps) < n * int(ro.decode_steps)  # compaction ran
  forced, _ = continuous(params, prompt, pm, G, scfg, u, slots=8, levels=2, attention="paged", page_size=4,
                         force_NxL=ref.tokens_NxL)
  assert_same(forced, ref)


def test_paged_engine_under_vmap(params):
  """Vmapped runs (studies/vmapped_runs.py's form) over the paged store: each run equals its own static rollout."""
  prompt, pm = prompts(B, seed=2)
  G = 2
  scfg = S.SamplingConfig(max_new_tokens=L, eos_id=(3, 7, 11, 13, 17))
  us = jnp.stack([S.uniforms(jax.random.PRNGKey(s), L, B * G) for s in (0, 1)])
  f = jax.jit(jax.vmap(lambda u: E.sample_groups(MCFG, params, prompt, pm, G, scfg, u_LxN=u, slots=4, levels=2,
                                                 attention="paged", page_size=4)))
  ros, _ = f(us)
  for r in range(2):
    assert_same(jax.tree.map(lambda x: x[r], ros), reference(params, prompt, pm, G, scfg, us[r]))


def test_store_holds_prompts_unpadded_from_position_zero():
  """prompt_pages + init_pool + admit + table: reading a slot's first plen positions through its page table gives
  its prompt's K and V without the left pads, in order (NumPy), for every pad count and a prompt of full pages."""
  rng = np.random.default_rng(0)
  b, kh, d, p, z, slots = 4, 2, 3, 8, 4, 4
  k = rng.standard_normal((b, kh, d, p)).astype(np.float32)
  v = rng.standard_normal((b, kh, p, d)).astype(np.float32)
  plen = np.array([8, 5, 4, 1])
  geo = PA.geometry(b, p, 6, slots, 1, z)
  assert (geo.full, geo.own, geo.pages_per_seq) == (2, 3, 5)  # ceil((z - 1 + L) / z) own pages: nothing runs out
  # Each store function as one program, as the engine's jit runs it (eagerly, ~60 one-op programs compiled).
  full, partial = jit_call(PA.prompt_pages, geo, k, v, plen)
  pool = jit_call(PA.init_pool, geo, full)
  group = np.array([3, 2, 1, 0])
  pool = jit_call(PA.admit, geo, pool, np.ones(slots, bool), group, partial)
  tbl = np.asarray(jit_call(PA.table, geo, group, plen))
  pages = np.asarray(pool)[0]
  for s, g in enumerate(np.asarray(group)):
    seq = pages[tbl[s]].reshape(-1, 2 * kh, d)[:plen[g]]  # [plen, C, D]
    np.testing.assert_array_equal(seq[:, 0::2], k[g, :, :, p - plen[g]:].transpose(2, 0, 1))
    np.testing.assert_array_equal(seq[:, 1::2], v[g, :, p - plen[g]:].transpose(1, 0, 2))
    own = geo.prompts * geo.full + s * geo.own
    assert set(tbl[s, plen[g] // z:]) <= set(range(own, own + geo.own))  # completion pages: the slot's own


@pytest.mark.parametrize("kh,h", [(2, 4), (1, 2)])
def test_reference_equals_the_tpu_kernels_own_reference(kh, h):
  """paged_attention.reference on random pages, page tables and kv_lens (GQA, one query per sequence) =
  ragged_paged_attention's ref_ragged_paged_attention, sm_scale = 1/sqrt(head_dim)."""
  from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel as rpa
  rng = np.random.default_rng(kh + h)
  s, d, z, m, q_pages = 5, 16, 4, 6, 40
  q = rng.standard_normal((s, h, d)).astype(np.float32)
  pages = rng.standard_normal((q_pages, z, 2 * kh, d)).astype(np.float32)
  tbl = rng.permutation(q_pages)[:s * m].reshape(s, m).astype(np.int32)
  kv_len = np.asarray([1, 7, 24, 3, 13], np.int32)
  got = jit_call(PA.reference, q, pages, tbl, kv_len)
  # The kernel's reference loops over sequences in Python and slices each to its kv_len, so it needs concrete
  # lengths and tables: closed over as NumPy (static under the trace), it traces as one program over q and the pages
  # instead of ~120 one-op programs eagerly, the same ops on the same values.
  want = jax.jit(lambda q, pages: rpa.ref_ragged_paged_attention(
      q, pages, kv_len, tbl, np.arange(s + 1, dtype=np.int32), np.array([s], np.int32), sm_scale=1 / np.sqrt(d)))(
          q, pages)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=2e-6)


# --------------------------------------------------------------------------------------------- config


def _config(**sampling):
  """The base config with a Qwen2.5-0.5B-like attention shape (head_dim 64: the TPU kernel does not compile it)."""
  from grpo_jax.config import config_lib
  c = config_lib.base_config()
  c.mesh.update(data=1, fsdp=1, tensor=1)
  c.model.update(hidden=256, heads=4, kv_heads=2, head_dim=64)
  c.sampling.update(sampling)
  return c


@pytest.mark.parametrize("over,msg", [
    (dict(engine="continuous", decode_attention="tpu_ragged"),
     r"config\.model\.head_dim=64: the TPU ragged paged attention kernel needs head_dim 128; set "
     r"sampling\.decode_attention='auto'"),
    (dict(engine="static", decode_attention="paged"), r"config\.sampling\.decode_attention: 'paged' is the "
     r"continuous engine's"),
    (dict(engine="continuous", decode_attention="flash"), r"config\.sampling\.decode_attention: unknown value"),
    (dict(engine="continuous", page_size=0), r"config\.sampling\.page_size: must be a positive integer"),
])
def test_bad_decode_attention_is_one_config_error(over, msg):
  from grpo_jax.run import validate
  c = _config(**over)
  with pytest.raises(validate.ConfigError, match=msg) as e:
    validate.validate_rl(c, num_devices=1)
  assert "\n" not in str(e.value)


def test_tpu_ragged_config_errors_name_page_size_and_pass_at_head_dim_128():
  from grpo_jax.run import validate
  c = _config(engine="continuous", decode_attention="tpu_ragged", page_size=64)
  c.model.update(hidden=256, heads=2, kv_heads=1, head_dim=128)
  with pytest.raises(validate.ConfigError, match=r"config\.sampling\.page_size=64: the TPU kernel"):
    validate.validate_rl(c, num_devices=1)
  c.sampling.page_size = 16
  validate.validate_rl(c, num_devices=1)


def test_auto_picks_the_tpu_kernel_only_where_it_fits_and_logs_the_fallback():
  """rl/auto.py: tpu_ragged on a TPU at head_dim 128; at head_dim 64 (or on the CPU) plain, with the reason in the
  choice `resolve` logs; the static engine leaves the key alone."""
  from grpo_jax.rl import auto
  c = _config(engine="continuous")
  ctx = lambda platform: auto.Context(dict(data=1, fsdp=1, tensor=1), None, platform)
  got, why = auto.resolve(c, ctx("tpu"))
  assert got.sampling.decode_attention == "plain" and c.sampling.decode_attention == "auto"
  assert "model.head_dim=64" in why["sampling.decode_attention"] and "falling back" in why["sampling.decode_attention"]
  c.model.update(hidden=256, heads=2, kv_heads=1, head_dim=128)
  assert auto.resolve(c, ctx("tpu"))[0].sampling.decode_attention == "tpu_ragged"
  cpu, why = auto.resolve(c, ctx("cpu"))
  assert cpu.sampling.decode_attention == "plain" and "platform cpu" in why["sampling.decode_attention"]
  c.sampling.engine = "static"
  assert auto.resolve(c, ctx("tpu"))[0].sampling.decode_attention == "auto"
  mcfg = MCFG  # the engine's own fallback for an unresolved auto: this backend (the CPU here)
  assert E.attention_kwargs(_config(engine="continuous", page_size=8), mcfg) == dict(attention="plain", page_size=8)


# --------------------------------------------------------------------------------------------- TPU (libtpu)

# The continuous engine with decode_attention=tpu_ragged, lowered and compiled for a v5e:2x2 slice (4 chips, FSDP)
# from this CPU host: a 2-layer model with head_dim 128, 8 slots for 16 rows, 2 compaction phases; writes the
# lowered StableHLO to argv[1].
_TPU_PAGED = r"""
import sys, jax, jax.numpy as jnp
from jax.experimental import topologies
from grpo_jax.infra import sharding
from grpo_jax.model import model as M
from grpo_jax.rollout import engine as E, sampling as S
devices = list(topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x2").devices)
mesh = sharding.make_mesh(dict(data=1, fsdp=-1, tensor=1), devices)
mcfg = M.ModelConfig(vocab_size=512, hidden=256, layers=2, heads=2, kv_heads=1, head_dim=128, inter=512, max_len=128)
abstract = jax.eval_shape(lambda: M.init_params(mcfg, jax.random.PRNGKey(0)))
params = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract,
                      sharding.tree_shardings(mesh, M.param_axes(mcfg)))
B, G, P, L = 4, 4, 16, 32
scfg = S.SamplingConfig(max_new_tokens=L, eos_id=(3,))
prompt = jax.ShapeDtypeStruct((B, P), jnp.int32, sharding=sharding.batch_sharding(mesh, 2))
u = jax.ShapeDtypeStruct((L, B * G), jnp.float32)
run = lambda params, pr, pm, u: E.sample_groups(mcfg, params, pr, pm, G, scfg, u_LxN=u, slots=8, levels=2, split=4,
                                                attention="tpu_ragged", page_size=16)[0].tokens_NxL
with sharding.mesh_context(mesh):
  lowered = jax.jit(run).lower(params, prompt, prompt, u)
open(sys.argv[1], "w").write(lowered.as_text())
lowered.compile()  # Mosaic compiles the kernel for the TPU target
"""


def kernel_sites(text: str, kernel: str) -> tuple[int, int]:
  """(call sites of `kernel` inside a stablehlo.while, outside any loop in main) in lowered StableHLO text: the
  custom call naming it, or a call of a function that (transitively) holds it -- shard_map and jit bodies are
  outlined functions. Regions are found by indentation, as MLIR prints them (`while(...)`, `cond {`, `} do {`, `}`)."""
  funcs, body = {}, None
  for line in text.splitlines():
    m = re.match(r"  func\.func \w+ @([\w.$-]+)\(", line)
    if m:
      body = funcs.setdefault(m.group(1), [])
    elif body is not None:
      body.append(line)
  named = f'kernel_name = "{kernel}"'
  holds = {f for f, lines in funcs.items() if any(named in l for l in lines)}
  calls = lambda l, fs: any(re.search(rf"call @{re.escape(g)}\(", l) for g in fs)
  while True:
    new = {f for f, lines in funcs.items() if f not in holds and any(calls(l, holds) for l in lines)}
    if not new:
      break
    holds |= new
  inside = outside = 0
  for f, lines in funcs.items():
    loops = []  # indentation of the enclosing while ops
    for l in lines:
      ind = len(l) - len(l.lstrip())
      while loops and (ind < loops[-1] or (ind == loops[-1] and l.strip() not in ("cond {", "} do {"))):
        loops.pop()
      if "stablehlo.while(" in l:
        loops.append(ind)
      elif named in l or calls(l, holds):
        inside += bool(loops)
        outside += not loops and f == "main"
  return inside, outside


@conftest.requires("libtpu", "libtpu is not importable: pip install libtpu==0.0.42.1 (the version jax 0.10.2 pins)")
def test_tpu_lowering_puts_the_ragged_paged_kernel_in_the_decode_loop(tmp_path):
  """On a TPU target the engine's decode step calls the ragged paged attention kernel (a tpu_custom_call) once per
  layer in each compaction phase's while body and nowhere else, and the program compiles."""
  out = subprocess.run([sys.executable, "-c", _TPU_PAGED, str(tmp_path / "lowered.mlir")], capture_output=True,
                       text=True, timeout=600,
                       env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join(sys.path)))
  assert out.returncode == 0, out.stderr[-3000:]
  text = (tmp_path / "lowered.mlir").read_text()
  assert "@tpu_custom_call" in text
  assert kernel_sites(text, "ragged_paged_attention_kernel") == (2 * 2, 0)  # 2 layers x 2 phases, none outside


def test_goldens_hold_with_the_paged_store(monkeypatch):
  """The GRPO golden run (3 steps) with the continuous engine, 8 slots for 16 rows and decode_attention=paged
  (rl/rollout.py passes the key through engine.attention_kwargs): the pinned numbers."""
  assert_goldens_with(monkeypatch, engine="continuous", slots=8, compaction=2, decode_attention="paged", page_size=4)


def test_memory_plan_models_the_paged_store():
  """plan_terms: with the paged store the rollout holds each slot's ceil((Z - 1 + L) / Z) pages and every prompt's
  full pages on every device, by hand for 1.5B, 16 prompts x G16, 512 + 8192, fsdp=8, 64 slots, Z = 16."""
  from grpo_jax.config import config_lib
  from grpo_jax.rl import memory_plan
  mesh = dict(data=1, fsdp=8, tensor=1)
  c = memory_plan.workload_config("qwen2.5-1.5b", 16, 16, 512, 8192, mesh, engine="continuous", slots=64)
  paged = config_lib.override(c, {"sampling.decode_attention": "tpu_ragged", "sampling.page_size": 16})
  r = memory_plan.plan(paged, mesh, "tpu").rollout
  kv_token = 2 * 28 * 2 * 128 * 2  # K and V, 28 layers, 2 KV heads of 128, bf16
  assert r["slot kv pages (S x own pages)"] == 64 // 8 * 513 * 16 * kv_token  # ceil((15 + 8192) / 16) = 513 pages
  assert r["prompt kv pages (all B prompts per device)"] == 16 * 512 * kv_token
  plain = memory_plan.plan(c, mesh, "tpu").rollout
  assert plain["prompt kv cache (B x P)"] == 2 * 512 * kv_token and "slot kv pages (S x own pages)" not in plain


def test_cli_refuses_tpu_ragged_below_head_dim_128_with_one_line_exit_2(tmp_path):
  """The CLI path: grpo_arith:small (head_dim 16) with decode_attention=tpu_ragged exits 2 with one line naming the
  key, before anything is written or compiled."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  out = subprocess.run([sys.executable, "-m", "grpo_jax.main", "--config=configs/grpo_arith.py:small",
                        f"--workdir={tmp_path / 'run'}", "--config.sampling.engine=continuous",
                        "--config.sampling.decode_attention=tpu_ragged"], cwd=root, capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, PYTHONPATH=root, JAX_PLATFORMS="cpu"))
  assert out.returncode == 2, out.stderr[-2000:]
  assert len(out.stderr.strip().splitlines()) == 1, out.stderr[-2000:]
  assert "config.model.head_dim=" in out.stderr and "needs head_dim 128" in out.stderr, out.stderr
  assert not os.path.exists(tmp_path / "run")
