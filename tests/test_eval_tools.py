"""What ablations evaluate with: unbiased pass@k against brute force, the length split by correctness, and the ScaleRL
sigmoid fitter on synthetic curves of known (A, B, C_mid)."""
import itertools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.rl import length_stats
from grpo_jax.run import evaluation
from grpo_jax.studies import scaling_fit
from grpo_jax.studies import stats


def brute_pass_at_k(ok: list[bool], k: int) -> float:
  """The fraction of all k-subsets of the n samples that contain a right one: what pass@k estimates unbiasedly."""
  subsets = list(itertools.combinations(range(len(ok)), k))
  return sum(any(ok[i] for i in s) for s in subsets) / len(subsets)


def test_pass_at_k_equals_brute_force_on_small_n():
  for n in range(1, 8):
    for c in range(n + 1):
      ok = [True] * c + [False] * (n - c)
      for k in range(1, n + 1):
        assert evaluation.pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(ok, k), abs=1e-12), (n, c, k)


def test_pass_at_k_curve_to_256_samples():
  """n = 256 samples per prompt (one sampled generate call with eval.n_samples = 256): exact at the ends, monotone in
  k, and against brute force over random subsets for a large k."""
  rng = np.random.default_rng(0)
  p_Q = np.array([0.0, 0.01, 0.2, 1.0])
  ok_QxN = rng.random((4, 256)) < p_Q[:, None]
  ks = [1, 2, 4, 8, 16, 32, 64, 128, 256]
  curve = evaluation.pass_at_k_curve(ok_QxN, ks)
  c_Q = ok_QxN.sum(1)
  assert curve[1] == pytest.approx(np.mean(c_Q / 256))
  assert curve[256] == pytest.approx(np.mean(c_Q > 0))
  vals = [curve[k] for k in ks]
  assert all(a <= b + 1e-12 for a, b in zip(vals, vals[1:]))
  # prompt 1 (few right samples), k = 64: Monte Carlo over subsets agrees with the estimator
  ok = ok_QxN[1]
  draws = np.array([ok[rng.choice(256, 64, replace=False)].any() for _ in range(4000)])
  assert evaluation.pass_at_k(256, int(ok.sum()), 64) == pytest.approx(draws.mean(), abs=0.03)
  with pytest.raises(ValueError, match="exceeds eval.n_samples"):
    evaluation.pass_at_k(4, 1, 8)


def test_pass_at_k_curve_refuses_what_it_read_silently():
  """k = 1.5 was int()-ed to pass@1 (and keyed 1), an empty matrix gave NaN with a NumPy warning, a NaN correctness
  counted as a wrong sample: each refused in one ValueError. NumPy integers are integers."""
  ok = np.array([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 1.0]])
  assert evaluation.pass_at_k_curve(ok, [np.int64(1), 4]) == {1: pytest.approx(0.375), 4: 1.0}
  for bad, ks, match in ((ok, [1.5], "k=1.5 is no integer"), (ok, [True], "k=True is no integer"),
                         (np.zeros((0, 4)), [1], "at least one prompt"), (ok[0], [1], "at least one prompt"),
                         (np.where(ok > 0, np.nan, 0.0), [1], "NaN or inf")):
    with pytest.raises(ValueError, match=match):
      evaluation.pass_at_k_curve(bad, ks)


def test_pass_at_k_refuses_counts_outside_the_samples_and_k_zero():
  """c > n returned 1.0, c < 0 returned −0.5 (pass_at_k(5, −1, 2)) and k = 0 returned 0.0: each a number no
  sampling can give, from a count that was computed wrong upstream. n < k is refused as before; k = n and the ends
  c = 0, c = n at n = 256 are exact."""
  for n, c, k in [(5, 6, 2), (5, -1, 2), (5, 2, 0), (256, 257, 256)]:
    with pytest.raises(ValueError, match="0 <= c <= n"):
      evaluation.pass_at_k(n, c, k)
  assert evaluation.pass_at_k(256, 0, 256) == 0.0 and evaluation.pass_at_k(256, 256, 1) == 1.0
  assert evaluation.pass_at_k(256, 1, 256) == 1.0  # k = n: every subset is the whole set
  # k = 255 of 256 with one right sample: 1 − C(255, 255)/C(256, 255) = 1 − 1/256 (hand-computed)
  assert evaluation.pass_at_k(256, 1, 255) == 1 - 1 / 256
  # float64 from exact integers at n = 256: against the product form 1 − Π_{i=n−c+1}^{n} (1 − k/i) in NumPy
  for c, k in [(3, 100), (50, 128), (200, 17)]:
    prod = 1 - np.prod(1 - k / np.arange(256 - c + 1, 257, dtype=np.float64))
    assert evaluation.pass_at_k(256, c, k) == pytest.approx(prod, rel=1e-12, abs=1e-15)


def test_lengths_split_by_correctness():
  right, wrong = length_stats.split_by(jnp.array([3, 5, 10, 2]), jnp.array([1.0, 0.0, 1.0, 0.0]) > 0.5)
  assert float(right) == 6.5 and float(wrong) == 3.5
  right, wrong = length_stats.split_by(jnp.array([3, 5]), jnp.array([False, False]))
  assert np.isnan(float(right)) and float(wrong) == 4.0


def test_length_split_of_an_all_right_step_is_nan_not_zero():
  """An all-right batch has no wrong completion: its `incorrect` length was 0, which a mean over steps (or seeds)
  averaged in as a measured length — two steps of wrong lengths 10 and none read 5. NaN is skipped by
  studies/stats.summarize and np.nanmean, giving 10. Under jit too, and with float lengths."""
  split = jax.jit(length_stats.split_by)
  steps = [split(jnp.array([10, 10, 4]), jnp.array([False, False, True])),
           split(jnp.array([7, 9, 2]), jnp.array([True, True, True]))]
  wrong = [float(w) for _, w in steps]
  assert wrong[0] == 10.0 and np.isnan(wrong[1])
  assert np.nanmean(wrong) == 10.0 and stats.summarize(wrong).mean == 10.0 and stats.summarize(wrong).n == 1
  right = [float(r) for r, _ in steps]
  assert right == [4.0, 6.0]
  r, w = split(jnp.array([1.5, 2.5]), jnp.array([True, True]))
  assert float(r) == 2.0 and np.isnan(float(w))


@pytest.mark.parametrize("A,B,C_mid,R0", [(0.8, 1.5, 300.0, 0.1), (0.55, 0.7, 40.0, 0.3), (0.95, 3.0, 2000.0, 0.0)])
def test_sigmoid_fit_recovers_known_parameters(A, B, C_mid, R0):
  C = np.geomspace(C_mid / 30, C_mid * 30, 25)
  exact = scaling_fit.sigmoid(C, A, B, C_mid, R0)
  f = scaling_fit.fit(C, exact, R0=R0)
  assert (f.A, f.B, f.C_mid) == (pytest.approx(A, rel=1e-3), pytest.approx(B, rel=1e-3),
                                  pytest.approx(C_mid, rel=1e-3))
  # with noise (±0.01 reward) the parameters come back within a few percent
  rng = np.random.default_rng(1)
  f = scaling_fit.fit(C, exact + rng.normal(size=C.shape) * 0.01, R0=R0)
  assert abs(f.A - A) < 0.03 and abs(np.log(f.B / B)) < 0.25 and abs(np.log(f.C_mid / C_mid)) < 0.25
  assert f.rmse < 0.02


def test_sigmoid_fit_over_seeds_gives_cis_that_cover_the_truth():
  rng = np.random.default_rng(2)
  A, B, C_mid, R0 = 0.7, 1.2, 100.0, 0.2
  C = np.geomspace(5, 3000, 20)
  curves = [scaling_fit.sigmoid(C, A, B, C_mid, R0) + rng.normal(size=C.shape) * 0.015 for _ in range(5)]
  out = scaling_fit.fit_seeds(C, curves, R0=R0)
  assert out.A.n == 5 and abs(out.A.mean - A) <= out.A.half_width + 1e-3
  assert abs(out.B.mean - B) <= out.B.half_width + 0.05 and abs(out.C_mid.mean - C_mid) <= out.C_mid.half_width + 5.0
  with pytest.raises(ValueError, match="need at least 4"):
    scaling_fit.fit([1.0, 2.0], [0.1, 0.2])
  # enough points but only 2 computes: no sigmoid is determined (this fitted A = 7e9, B = 10 before it was refused)
  with pytest.raises(ValueError, match="2 distinct compute values; R0, A, B, C_mid need at least 4"):
    scaling_fit.fit([1.0, 1.0, 2.0, 2.0], [0.1, 0.1, 0.8, 0.8])


def test_sigmoid_fit_reads_an_evaluation_at_compute_0_as_its_start_and_refuses_non_finite_points():
  """An evaluation at step 0 (C = 0) was dropped with the non-finite ones (log 0), so R0 became the next point's
  reward: a sigmoid of A 0.8, B 1.5, C_mid 15, R0 0.1 evaluated at steps 0..59 fitted A 0.791, B 1.567, no flag. C = 0
  is the sigmoid's limit R0 (B > 0): it is R0's point, fitted exactly. A NaN/inf reward or compute, or C < 0, was
  dropped as silently (R0 moved when it was the first point): refused, naming it; so are ragged or 2-D inputs."""
  C = np.arange(0.0, 60.0)
  R = np.r_[0.1, scaling_fit.sigmoid(C[1:], 0.8, 1.5, 15.0, 0.1)]
  for R0 in (None, 0.1):
    f = scaling_fit.fit(C, R, R0=R0)
    assert f.R0 == 0.1 and not f.edge and f.rmse < 1e-9
    assert (f.A, f.B, f.C_mid) == (pytest.approx(0.8, rel=1e-6), pytest.approx(1.5, rel=1e-6),
                                    pytest.approx(15.0, rel=1e-6))
  for i, bad in ((0, np.nan), (29, np.inf)):
    with pytest.raises(ValueError, match=f"the first at index {i} "):
      scaling_fit.fit(C, np.where(np.arange(60) == i, bad, R))
  for C_bad in (np.r_[-1.0, C[1:]], np.r_[np.nan, C[1:]]):
    with pytest.raises(ValueError, match="non-finite value or C < 0, the first at index 0"):
      scaling_fit.fit(C_bad, R)
  with pytest.raises(ValueError, match="must be 1-D and of one length"):
    scaling_fit.fit(C, R[:-1])
  with pytest.raises(ValueError, match="R0=nan must be a finite reward"):
    scaling_fit.fit(C, R, R0=float("nan"))
  with pytest.raises(ValueError, match="at 1 distinct compute values"):  # every point at the start: no curve
    scaling_fit.fit(np.zeros(6), np.arange(6.0))


def test_sigmoid_fit_refuses_three_computes():
  """R0 is the first point's reward, so 3 computes leave 2 points for A, B, C_mid: a family of sigmoids passes through
  them. The fit returned one of them (B = 6.2, C_mid = 8.9 for (1, 10, 100) -> (0.1, 0.5, 0.7); B = 5.5, C_mid = 11
  when the middle point moves to 0.3) with rmse < 1e-6 and no flag. Now refused, with R0 given too (3 points for 3
  parameters leave no residual for the noise flag); 4 computes fit."""
  for R0 in (None, 0.1):
    with pytest.raises(ValueError, match="3 usable points .* need at least 4"):
      scaling_fit.fit([1.0, 10.0, 100.0], [0.1, 0.5, 0.7], R0=R0)
    with pytest.raises(ValueError, match="3 distinct compute values; R0, A, B, C_mid need at least 4"):
      scaling_fit.fit([1.0, 10.0, 10.0, 100.0], [0.1, 0.5, 0.5, 0.7], R0=R0)
  C = np.geomspace(1.0, 1000.0, 4)
  f = scaling_fit.fit(C, scaling_fit.sigmoid(C, 0.8, 1.5, 30.0, 0.1))  # R0 = the first point's 0.104
  assert abs(f.A - 0.8) < 0.01 and abs(np.log(f.B / 1.5)) < 0.05 and not f.edge


def test_sigmoid_fit_flags_a_midpoint_outside_the_compute_measured():
  """Points at C = 10..1000 of a sigmoid whose C_mid = 1e5 show only its foot, a power law: A and C_mid are not
  separately measured there. The fit returned A = 0.16 (the truth: 0.8), C_mid = 6199, rmse 2.5e-5 and no flag, a
  confident extrapolation that fit_seeds averaged in. Now flagged, as is a C_mid before the first point; C_mid inside
  the points (once at 0.9 of the last compute) is not."""
  C = np.geomspace(10.0, 1000.0, 20)
  far = scaling_fit.fit(C, scaling_fit.sigmoid(C, 0.8, 1.0, 1e5, 0.1), A_max=1.0)
  assert far.C_mid > C.max() and abs(far.A - 0.8) > 0.5  # the extrapolation: A is far from the truth
  assert far.edge and "C_mid outside the compute measured" in far.flags, far
  out = scaling_fit.fit_seeds(C, [scaling_fit.sigmoid(C, 0.8, 1.0, 1e5, 0.1)] * 2, A_max=1.0)
  assert out.A.n == 0 and np.isnan(out.A.mean)
  before = scaling_fit.fit(C, scaling_fit.sigmoid(C, 0.8, 1.5, 3.0, 0.1), R0=0.1, A_max=1.0)
  assert before.C_mid < C.min() and "C_mid outside the compute measured" in before.flags, before
  inside = scaling_fit.fit(C, scaling_fit.sigmoid(C, 0.8, 1.5, 900.0, 0.1), R0=0.1, A_max=1.0)
  assert inside.flags == () and inside.C_mid == pytest.approx(900.0, rel=1e-3) and inside.A == pytest.approx(0.8, rel=1e-3)


def test_seed_cis_leave_out_flagged_fits():
  """3 seeds rising to A = 0.7 (B = 1.2) and 2 flat seeds: the flat seeds' fits are flagged (their B sits at the
  box's 10 or describes noise), and averaging them in moved the mean B from 1.2 to several (old code: B over all 5
  seeds). The summaries are over the 3 resolved seeds; every fit stays in `fits`; all flagged gives nan, n = 0.
  The CI is Student t: t(0.975, 2) = 4.302653 (tables) times the sample std / √3, against NumPy."""
  rng = np.random.default_rng(4)
  C = np.geomspace(5, 3000, 20)
  rising = [scaling_fit.sigmoid(C, 0.7, 1.2, 100.0, 0.2) + rng.normal(size=C.shape) * 0.01 for _ in range(3)]
  flat = [0.2 + rng.normal(size=C.shape) * 0.01 for _ in range(2)]
  out = scaling_fit.fit_seeds(C, rising + flat, A_max=1.0)
  assert [f.edge for f in out.fits] == [False, False, False, True, True]
  Bs = np.array([f.B for f in out.fits[:3]])
  assert out.B.n == 3 and out.B.mean == pytest.approx(Bs.mean()) and abs(np.log(out.B.mean / 1.2)) < 0.15
  assert out.B.half_width == pytest.approx(4.302653 * Bs.std(ddof=1) / np.sqrt(3), rel=1e-6)
  assert abs(np.mean([f.B for f in out.fits]) - 1.2) > 0.5  # what the mean over all seeds would have said
  none = scaling_fit.fit_seeds(C, flat, A_max=1.0)
  assert none.A.n == 0 and np.isnan(none.A.mean) and len(none.fits) == 2


def test_sigmoid_fit_bounds_a_by_the_rewards_ceiling_and_flags_edge_fits():
  """A curve still rising linearly at the last point: unbounded, A runs far past any reachable accuracy; with A_max
  = 1 it stops at 1, is the bounded least-squares optimum (no A ≤ 1 on a finer grid does better), and is flagged.
  A real sigmoid inside the box is neither moved by the bound nor flagged."""
  C = np.arange(1.0, 101.0)
  R = 0.1 + 0.004 * C  # 0.1 -> 0.5, no sign of saturating
  free = scaling_fit.fit(C, R)
  assert free.A > 1.0 and free.edge
  bounded = scaling_fit.fit(C, R, A_max=1.0)
  assert bounded.A == pytest.approx(1.0) and bounded.edge
  # bounded optimum: for its (B, C_mid), the SSE over A in [R0, 1] is smallest at A = 1 (the quadratic's vertex is
  # above 1), checked by brute force against the numpy model
  sse = lambda A: float(np.sum((scaling_fit.sigmoid(C, A, bounded.B, bounded.C_mid, bounded.R0) - R) ** 2))
  assert all(sse(1.0) <= sse(a) + 1e-12 for a in np.linspace(bounded.R0, 1.0, 201))
  assert bounded.rmse >= free.rmse - 1e-12  # a bound cannot fit better than no bound
  Cs = np.geomspace(10, 3000, 25)
  inside = scaling_fit.fit(Cs, scaling_fit.sigmoid(Cs, 0.8, 1.5, 300.0, 0.1), R0=0.1, A_max=1.0)
  assert inside.A == pytest.approx(0.8, rel=1e-3) and not inside.edge
  with pytest.raises(ValueError, match="A_max=0.05 is not above"):
    scaling_fit.fit(C, R, A_max=0.05)


def test_a_curve_at_its_ceiling_from_the_start_is_a_flagged_fit_not_an_error():
  """A seed whose train accuracy is 1 from its first step (R0 = A_max = 1) has no room to rise: its fit is A = R0,
  flagged, and left out of the seeds' CIs. It was refused (ValueError 'A_max=1.0 is not above the starting reward'),
  which stopped table j's appendix after every row had trained, with no table written. A ceiling below R0 is still a
  bad argument."""
  from grpo_jax.studies.ablations import train_table
  C = np.arange(0.0, 40.0)
  at_one = scaling_fit.fit(C, np.ones_like(C), A_max=1.0)
  assert at_one.A == 1.0 and at_one.edge and "A at R0: no rise (flat or falling)" in at_one.flags
  rising = scaling_fit.sigmoid(C, 0.8, 1.5, 12.0, 0.2)
  out = scaling_fit.fit_seeds(C, [np.ones_like(C), rising, rising], A_max=1.0)
  assert [f.edge for f in out.fits] == [True, False, False] and out.A.n == 2 and out.A.mean == pytest.approx(0.8)
  with pytest.raises(ValueError, match="A_max=1.0 is not above the starting reward R0=1.2"):
    scaling_fit.fit(C, np.r_[1.2, np.ones(39)], A_max=1.0)
  # the table's appendix, as ablate writes it: steps 1..40, seed 0 right on every sample from the first step
  cell = {"curves": {"train accuracy reward": {"x": list(range(1, 41)), "y": [[1.0] * 40, rising.tolist()]}}}
  md = train_table.appendix({"fits": ("sigmoid",)}, {"row": cell})
  assert md.count("| row | 0.8 | 1.5 | 12 |") == 1 and "| 1 of 2 |" in md, md  # the rising seed alone


def test_sigmoid_fit_flags_falling_and_flat_curves_instead_of_fitting_them():
  """A falling curve (ScaleRL's sigmoid from R0 = 0.6 down to 0.1) fitted A = 0.10, B = 1.53, C_mid = 303 with no
  flag, and a flat curve with ±0.01 noise fitted a step of B = 6.8 at C_mid = 13 (its first point happened to be
  low), unflagged: both confident numbers for curves with no rise. Now A ≥ R0, and a fit with no rise or one within
  3 rmse of the noise is flagged, saying why. Real sigmoids with the same noise are not flagged."""
  C = np.geomspace(10, 1e4, 30)
  falling = scaling_fit.fit(C, scaling_fit.sigmoid(C, 0.1, 1.5, 300.0, 0.6))
  assert falling.A == falling.R0 and falling.edge and "A at R0: no rise (flat or falling)" in falling.flags
  rng = np.random.default_rng(0)
  for seed in range(5):
    noise = np.random.default_rng(seed).normal(size=C.size) * 0.01
    flat = scaling_fit.fit(C, 0.3 + noise, A_max=1.0)
    assert flat.edge and flat.flags, (seed, flat)  # a step at either end: the noise criterion or B at 10
    rising = scaling_fit.fit(C, scaling_fit.sigmoid(C, 0.8, 1.5, 300.0, 0.1) + noise, A_max=1.0)
    assert not rising.edge and rising.flags == () and abs(rising.A - 0.8) < 0.03, (seed, rising)
  # already at its asymptote from the second point on: the rise is before any measurement, B and C_mid unmeasured
  at_top = scaling_fit.fit(C, np.r_[0.1, np.full(C.size - 1, 0.8) + rng.normal(size=C.size - 1) * 0.005], A_max=1.0)
  assert at_top.edge and at_top.A == pytest.approx(0.8, abs=0.01)


def test_sigmoid_fit_flags_a_rise_then_a_collapse():
  """A rise to 0.8 whose last points fell back (to 0.1, 0.2) fitted A = 0.63-0.69, B = 4-5, C_mid = 5 with no flag
  (the collapse only pulled A down), and went into the seeds' CI as a measured sigmoid. Now a mean of the last points
  more than 4 standard errors below the curve's peak is flagged; noisy sigmoids of every length stay unflagged."""
  C = np.arange(1.0, 21.0)
  rise = scaling_fit.sigmoid(C, 0.8, 3.0, 6.0, 0.1)
  collapses = {"last point": np.r_[rise[:-1], 0.1], "last three": np.r_[rise[:-3], 0.5, 0.3, 0.2],
               "gradual": np.where(C <= 10, rise, rise[9] - 0.07 * (C - 10))}
  flag = "falls after its peak: a rise then a collapse, no sigmoid"
  for seed in range(3):
    noise = np.random.default_rng(seed).normal(size=C.size) * 0.01
    for name, R in collapses.items():
      f = scaling_fit.fit(C, R + noise, A_max=1.0)
      assert f.edge and flag in f.flags, (name, seed, f)
    for R in (rise, scaling_fit.sigmoid(C, 0.6, 1.0, 15.0, 0.2)):  # a plateau reached, one still rising
      ok = scaling_fit.fit(C, R + noise, A_max=1.0)
      assert flag not in ok.flags, (seed, ok)
  out = scaling_fit.fit_seeds(C, [rise + 0.01 * np.random.default_rng(s).normal(size=C.size) for s in range(3)]
                              + [collapses["last three"]], A_max=1.0)
  assert [f.edge for f in out.fits] == [False, False, False, True] and out.A.n == 3
  # the noise is read from the second differences, not the fit's rmse (which the collapse inflates): the criterion by
  # hand on 9 points, w = 2: window means peak at 0.8, the last is 0.45; σ = 0 (a noise-free plateau) flags it
  drop, limit = scaling_fit._drop_after_peak(np.arange(1.0, 10.0), np.array([.1] + [.8] * 7 + [.1]))  # pylint: disable=protected-access
  assert drop == pytest.approx(0.35) and limit == 0.0


def test_training_tables_appendix_fits_sigmoid_and_entropy():
  """train_table.appendix on cells with known curves: the sigmoid's A and the entropy fit's a, b come back, and the
  entropy change correlates with −Cov by construction."""
  import ml_collections
  from grpo_jax.studies.ablations import train_table
  x = list(range(1, 101))
  # step t's rollout is sampled after t - 1 updates: the sigmoid of the updates
  R = [scaling_fit.sigmoid(np.asarray(x, float) - 1, 0.8, 2.0, 30.0, 0.1).tolist() for _ in range(3)]
  H = [np.linspace(2.0, 0.5, 100).tolist() for _ in range(3)]
  cov = [(-np.diff(np.asarray(h)) * 7).tolist() + [0.0] for h in H]  # ΔH_t = −Cov_t / 7 exactly
  R_e = [(0.9 - 0.1 * np.exp(np.asarray(h))).tolist() for h in H]  # R = −0.1·e^H + 0.9
  cells = {"v": {"curves": {"train accuracy reward": {"x": x, "y": R}, "policy entropy": {"x": x, "y": H},
                            "Cov(log pi, A)": {"x": x, "y": cov}}},
           "w": {"curves": {"train accuracy reward": {"x": x, "y": R_e}, "policy entropy": {"x": x, "y": H},
                            "Cov(log pi, A)": {"x": x, "y": cov}}}}
  md = train_table.appendix(ml_collections.ConfigDict(dict(fits=("sigmoid", "entropy"))), cells)
  sig, ent = md.split("### Reward")
  cell = lambda part, name, i: float(next(l for l in part.splitlines() if l.startswith(f"| {name} |")).split(
      " | ")[i].split(" ")[0].strip("| "))
  # the first step's reward is R0's point (C = 0): A, B, C_mid come back (fitted against the steps, R0 sat at C = 1:
  # A 0.7942, B 2.1, C_mid 30.81)
  assert [cell(sig, "v", i) for i in (1, 2, 3)] == [pytest.approx(0.8, abs=2e-4), pytest.approx(2.0, abs=2e-3),
                                                    pytest.approx(30.0, abs=0.05)]
  assert "| 0 of 3 |" in next(l for l in sig.splitlines() if l.startswith("| v |"))  # a sigmoid inside the box
  # a, b of R = −0.1·e^H + 0.9, and corr(ΔH, −Cov) = 1
  assert (cell(ent, "w", 1), cell(ent, "w", 2), cell(ent, "w", 3)) == (
      pytest.approx(0.1, abs=1e-6), pytest.approx(0.9, abs=1e-6), pytest.approx(1.0, abs=1e-9))
  assert train_table.appendix(ml_collections.ConfigDict(), cells) == ""
  # Cov 0 on every step but the last (no group with signal before it): no correlation is measured, nan, and no
  # NumPy "invalid value" warning (the guard read the whole curve, not the steps correlated)
  flat = {"w": {"curves": dict(cells["w"]["curves"], **{"Cov(log pi, A)": {"x": x, "y": [[0.0] * 99 + [1.0]] * 3}})}}
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    md = train_table.appendix(ml_collections.ConfigDict(dict(fits=("entropy",))), flat)
  assert "| w | 0.1" in md and md.count("nan") == 1, md


def test_entropy_fit_is_nan_where_the_entropy_did_not_move():
  """R = −a·e^H + b by least squares of R on e^H: hand case H = (0, ln 2, ln 3), R = 0.9 − 0.1·(1, 2, 3) gives a = 0.1,
  b = 0.9; random noisy curves against NumPy's polyfit. A constant H (polyfit: a = −0.044) or one varying only in
  its 7th digit (polyfit: a = 4.5e5) has no a: nan, which stats.summarize drops and the appendix counts."""
  a, b = scaling_fit.entropy_fit(np.log([1.0, 2.0, 3.0]), [0.8, 0.7, 0.6])
  assert (a, b) == (pytest.approx(0.1, abs=1e-12), pytest.approx(0.9, abs=1e-12))
  rng = np.random.default_rng(3)
  H = np.sort(rng.uniform(0.2, 2.0, 40))[::-1]
  R = 0.95 - 0.2 * np.exp(H) + rng.normal(size=40) * 0.01
  slope, icpt = np.polyfit(np.exp(H), R, 1)
  assert scaling_fit.entropy_fit(H, R) == (pytest.approx(-slope, rel=1e-9), pytest.approx(icpt, rel=1e-9))
  R6 = [0.1, 0.2, 0.3, 0.35, 0.4, 0.42]
  for flat in (np.full(6, 1.2), np.array([1.2] * 5 + [1.2000001])):
    assert all(np.isnan(scaling_fit.entropy_fit(flat, R6)))
  import ml_collections
  from grpo_jax.studies.ablations import train_table
  x = list(range(6))
  curves = lambda H: {"train accuracy reward": {"x": x, "y": [R6, R6]}, "policy entropy": {"x": x, "y": H},
                      "Cov(log pi, A)": {"x": x, "y": [[0.1] * 6, [0.2, 0.1, 0.3, 0.1, 0.2, 0.1]]}}
  md = train_table.appendix(ml_collections.ConfigDict(dict(fits=("entropy",))),
                            {"v": {"curves": curves([np.full(6, 1.2).tolist(), np.linspace(1.5, 1.0, 6).tolist()])}})
  assert next(l for l in md.splitlines() if l.startswith("| v |")).endswith("| 1 of 2 |")
