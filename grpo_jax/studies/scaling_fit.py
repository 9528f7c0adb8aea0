"""ScaleRL's compute–performance sigmoid, fitted without SciPy, with CIs over seeds.

    R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B)         (Khatri et al. 2025, arXiv 2510.13786, Eq. 1)

A is the asymptotic reward, B the scaling exponent (how steeply the curve rises in log C), C_mid the compute at which
half of the gain A − R0 is reached, R0 the reward at the start (fixed, not fitted: the first evaluation). Compute C
is whatever a run counts (steps, tokens, FLOPs); B and A do not depend on its unit, C_mid scales with it.

The fit: for fixed (log C_mid, log B) the model is linear in A, so A has a closed-form least-squares value (profiled
out); the remaining two parameters are found by a grid over log C_mid (inside the compute range, plus a decade either
side) × log B (0.1 … 10), then Nelder–Mead from the best grid points, inside that box (a fit on its edge means the
curve is no sigmoid over the compute measured: `SigmoidFit.edge`). A bounded reward bounds A (`A_max`, e.g. 1 for an
accuracy: ScaleRL's A is a pass rate): the SSE is quadratic in A, so the bounded optimum is the clipped one. A curve
still rising linearly at the last point otherwise "fits" an A far above any reachable reward (A = 27 for an accuracy
was seen); with the bound it stops at A_max and is flagged. A is also bounded below by R0 (ScaleRL's curves rise:
a falling curve fitted A < R0 with a confident B and C_mid and no flag), and a fit whose gain A − R0 is within
NOISE_GAINS × rmse of nothing (a flat curve whose first point is low by noise fitted a step there) is flagged: the
rise is not resolved, so B and C_mid are not measured. So is a fit whose C_mid lies outside the compute measured: the
points show one end of the sigmoid, and A (or B and C_mid) is extrapolated from it. `SigmoidFit.flags` names why a fit
is flagged. So is a curve that falls after its peak (`_drop_after_peak`): a sigmoid never falls, and a rise then a
collapse fitted a confident A between the peak and the collapse (A = 0.63, B = 5.3, C_mid = 5 for a rise to 0.8 whose
last three points fell to 0.2), unflagged. At least 4 distinct compute values (R0 and A, B, C_mid), or the fit refuses. Robust to the
start, no gradients, ~ms per curve.
Per seed one fit; `fit_seeds` gives mean ± 95% CI (Student t, studies/stats.py) of A, B, C_mid over the seeds whose
fit is not flagged (a flagged fit's values are the box's: averaged in, B = 10 of a flat seed moved the mean B).
"""
import dataclasses
import math
from typing import Sequence

import numpy as np

from grpo_jax.studies import stats


B_RANGE = (0.1, 10.0)  # the exponents searched (ScaleRL's fits lie in ~0.5-3)
# A gain A − R0 of at most this many rmse is no resolved rise: R0 is one measured point, so its own noise (≈ rmse)
# alone moves the gain by about one rmse, and with the plateau's mean, a flat curve's gain stays under 3 rmse with
# ~99.7% probability.
NOISE_GAINS = 3.0
MIN_POINTS = 4  # distinct compute values: R0 and A, B, C_mid
# A drop after the peak of more than this many standard errors of the window means is a collapse: the highest window
# mean of a plateau is itself ~2 standard errors above the plateau (the max over the windows), so 4 leaves noisy
# sigmoids unflagged (1 of 2,400 at 5-100 points, noise 0-0.03: one at 5 points; 0 of the 400 the docs count) and
# flags every rise to 0.8 whose last points fell to 0.1-0.2 (tests/test_eval_tools.py)
DROP_ERRORS = 4.0


@dataclasses.dataclass(frozen=True)
class SigmoidFit:
  A: float
  B: float
  C_mid: float
  R0: float
  rmse: float  # root mean squared residual of the fit
  # C_mid or B on the search box's edge, C_mid outside the compute measured (half the rise unseen), A at A_max, A at
  # R0 (a flat or falling curve), a gain within the noise or a fall after the peak:
  # the curve is no resolved sigmoid with an asymptote inside the compute measured, and A, B, C_mid describe the
  # box, not the run (`flags` says which)
  edge: bool = False
  flags: tuple[str, ...] = ()

  def predict(self, C) -> np.ndarray:
    return sigmoid(np.asarray(C, np.float64), self.A, self.B, self.C_mid, self.R0)


def sigmoid(C: np.ndarray, A: float, B: float, C_mid: float, R0: float) -> np.ndarray:
  """R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B), computed as R0 + (A − R0)·σ(B·(log C − log C_mid)); R0 at C = 0."""
  with np.errstate(divide="ignore"):  # log 0 = -inf: σ(-inf) = 0, R0 exactly
    z = B * (np.log(C) - math.log(C_mid))
  return R0 + (A - R0) / (1.0 + np.exp(-np.clip(z, -700, 700)))


def _profile(logC: np.ndarray, R: np.ndarray, R0: float, log_cmid: float, log_b: float,
             A_max: float = math.inf) -> tuple[float, float]:
  """(sum of squared residuals, A) with A at its least-squares value for this (C_mid, B) within [R0, A_max] (the
  SSE is a convex quadratic in A, so the bounded least-squares A is the clipped one)."""
  s = 1.0 / (1.0 + np.exp(-np.clip(math.exp(log_b) * (logC - log_cmid), -700, 700)))
  den = float(np.dot(s, s))
  gain = min(max(float(np.dot(s, R - R0)) / den if den > 0 else 0.0, 0.0), A_max - R0)
  res = R - R0 - gain * s
  return float(np.dot(res, res)), R0 + gain


def _drop_after_peak(C: np.ndarray, R: np.ndarray) -> tuple[float, float]:
  """(drop, threshold): how far the mean of the last w = max(2, n // 5) points (in order of C) lies below the highest
  mean of w consecutive points, and DROP_ERRORS standard errors of that difference. The noise σ is read from the
  second differences (their median: a smooth rise and a few collapsed points barely move it), since the fit's rmse
  grows with the very misfit this checks for."""
  R = R[np.argsort(C, kind="stable")]
  w = max(2, R.size // 5)
  means_W = np.convolve(R, np.ones(w) / w, mode="valid")
  sigma = float(np.median(np.abs(np.diff(R, 2)))) / (0.6745 * math.sqrt(6.0))  # Δ²R of iid noise σ: sd σ·√6
  return float(means_W.max() - means_W[-1]), DROP_ERRORS * sigma * math.sqrt(2.0 / w)


def _nelder_mead(f, x0: np.ndarray, step: np.ndarray, iters: int = 400, tol: float = 1e-12) -> np.ndarray:
  """Minimise f from x0 (standard coefficients: reflection 1, expansion 2, contraction ½, shrink ½)."""
  pts = [x0] + [x0 + np.eye(len(x0))[i] * step[i] for i in range(len(x0))]
  vals = [f(p) for p in pts]
  for _ in range(iters):
    order = np.argsort(vals)
    pts, vals = [pts[i] for i in order], [vals[i] for i in order]
    if abs(vals[-1] - vals[0]) <= tol * (abs(vals[0]) + tol):
      break
    centroid = np.mean(pts[:-1], axis=0)
    xr = centroid + (centroid - pts[-1])
    fr = f(xr)
    if fr < vals[0]:
      xe = centroid + 2.0 * (centroid - pts[-1])
      fe = f(xe)
      pts[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
    elif fr < vals[-2]:
      pts[-1], vals[-1] = xr, fr
    else:
      xc = centroid + 0.5 * (pts[-1] - centroid)
      fc = f(xc)
      if fc < vals[-1]:
        pts[-1], vals[-1] = xc, fc
      else:
        pts = [pts[0] + 0.5 * (p - pts[0]) for p in pts]
        vals = [f(p) for p in pts]
  return pts[int(np.argmin(vals))]


def fit(C: Sequence[float], R: Sequence[float], R0: float | None = None, A_max: float | None = None) -> SigmoidFit:
  """Least-squares fit of the sigmoid to points (C_i, R_i), C_i >= 0. A point at C = 0 (the evaluation before
  training) is the start: the sigmoid's limit there is R0, so it is R0's point (their mean, if several) and is fitted
  exactly; R0 may also be given. R0's default: R at C = 0, else R at the smallest C. A_max: the reward's ceiling
  (None: unbounded); it must be at least R0 (R0 at it: A = R0, flagged). A point with a non-finite C or R, or C < 0, is refused (ValueError): a NaN
  reward is a failed evaluation, and leaving it out silently moved R0 to the next point when it was the first."""
  C, R = np.asarray(C, np.float64), np.asarray(R, np.float64)
  if C.ndim != 1 or C.shape != R.shape:
    raise ValueError(f"scaling_fit.fit: C and R must be 1-D and of one length (one reward per compute), got shapes "
                     f"{C.shape} and {R.shape}; fit one curve per call (fit_seeds for several).")
  bad = ~(np.isfinite(C) & np.isfinite(R) & (C >= 0))
  if bad.any():
    i = int(np.argmax(bad))
    raise ValueError(f"scaling_fit.fit: {int(bad.sum())} point(s) with a non-finite value or C < 0, the first at "
                     f"index {i} (C={C[i]}, R={R[i]}); drop or repair them (a NaN reward is a failed evaluation; "
                     "compute counts from 0).")
  # The start: with C = 0 dropped (as it was, for log C), R0 became the next point's reward and the fit of an
  # evaluation at step 0 and on was biased (A 0.791, B 1.567 for a sigmoid of A 0.8, B 1.5 evaluated at steps 0..59)
  # and unflagged. R(C) -> R0 as C -> 0 (B > 0): C = 0 is R0's point.
  start = C == 0
  # R0 (one point's value) and A, B, C_mid: 4 numbers, so at least 4 computes. 3 left nothing to fit them by: any of
  # a family of (B, C_mid) passed through the points, and the fit returned one (B = 6.2, C_mid = 8.9 for (1, 10, 100)
  # -> (0.1, 0.5, 0.7)) with rmse 4e-7 and no flag, since the noise flag has no residual to read
  if C.size < MIN_POINTS:
    raise ValueError(f"scaling_fit.fit: {C.size} usable points (C >= 0); R0 and a sigmoid's A, B, C_mid need "
                     f"at least {MIN_POINTS} (evaluate more often, e.g. a smaller eval_every).")
  if np.unique(C).size < MIN_POINTS:  # e.g. 4 points at 2 computes fitted A = 7e9, B = 10: no curve there
    raise ValueError(f"scaling_fit.fit: the {C.size} points lie at {np.unique(C).size} distinct compute values; "
                     f"R0, A, B, C_mid need at least {MIN_POINTS} (pass each evaluation's own compute, e.g. its step).")
  R0 = (float(np.mean(R[start])) if start.any() else float(R[np.argmin(C)])) if R0 is None else float(R0)
  if not math.isfinite(R0):
    raise ValueError(f"scaling_fit.fit: R0={R0} must be a finite reward (the start); pass the first evaluation's "
                     "reward or None (R at C = 0, else at the smallest C).")
  a_max = math.inf if A_max is None else float(A_max)
  # R0 at the ceiling is a curve with no room to rise (an accuracy at 1 from the start), not a bad ceiling: its fit is
  # A = R0, flagged (no rise); refused, it stopped table j's appendix (every row trained) with no table written
  if not a_max >= R0:
    raise ValueError(f"scaling_fit.fit: A_max={A_max} is not above the starting reward R0={R0}; pass the reward's "
                     "ceiling (1 for an accuracy) or None.")
  start_sse = float(np.sum((R[start] - R0) ** 2))  # the model is R0 there whatever A, B, C_mid: a constant residual
  n_points, C_all, R_all = C.size, C, R
  C, R = C[~start], R[~start]
  logC = np.log(C)
  # the search box: C_mid within a decade of the measured compute, B in [0.1, 10]. A curve that is not a sigmoid
  # there (flat, falling) ends on the box's edge instead of running off to C_mid = 1e29: say so when reading it
  low = np.array([logC.min() - math.log(10), math.log(B_RANGE[0])])
  high = np.array([logC.max() + math.log(10), math.log(B_RANGE[1])])
  box = lambda x: np.clip(x, low, high)
  sse = lambda x: _profile(logC, R, R0, *box(x), a_max)[0] + float(np.sum((x - box(x)) ** 2))
  grid = [(lc, lb) for lc in np.linspace(low[0], high[0], 41) for lb in np.linspace(low[1], high[1], 25)]
  scores = np.array([sse(np.array(g)) for g in grid])
  best = None
  for i in np.argsort(scores)[:3]:  # a few starts: the surface has flat directions when the curve saturates
    x = box(_nelder_mead(sse, np.array(grid[i]), np.array([0.3, 0.2])))
    if best is None or sse(x) < sse(best):
      best = x
  err, A = _profile(logC, R, R0, best[0], best[1], a_max)
  tol = 1e-3  # in log units: Nelder–Mead stops near, not on, a bound
  rmse = math.sqrt((err + start_sse) / n_points)
  drop, drop_max = _drop_after_peak(C_all, R_all)
  flags = tuple(name for name, hit in (
      ("C_mid on the box's edge", best[0] <= low[0] + tol or best[0] >= high[0] - tol),
      ("B on the box's edge", best[1] <= low[1] + tol or best[1] >= high[1] - tol),
      # half the rise lies outside the compute measured: the curve seen is one end of the sigmoid, whose A (or B and
      # C_mid) the fit extrapolates (C_mid 1e5 of points at 10..1000 fitted A = 0.16 for 0.8, C_mid = 6199, no flag)
      ("C_mid outside the compute measured", best[0] < logC.min() or best[0] > logC.max()),
      ("A at A_max", A >= a_max - 1e-9),
      ("A at R0: no rise (flat or falling)", A <= R0 + 1e-12),
      (f"gain A - R0 within {NOISE_GAINS:g} rmse: rise not resolved", R0 + 1e-12 < A <= R0 + NOISE_GAINS * rmse),
      ("falls after its peak: a rise then a collapse, no sigmoid", drop > drop_max),
  ) if hit)
  return SigmoidFit(A=A, B=math.exp(best[1]), C_mid=math.exp(best[0]), R0=R0, rmse=rmse, edge=bool(flags),
                    flags=flags)


def entropy_fit(H: Sequence[float], R: Sequence[float]) -> tuple[float, float]:
  """(a, b) of R = −a·e^H + b (Cui et al. 2025, arXiv 2505.22617) by least squares of R on e^H; (nan, nan) when e^H
  does not vary beyond float32 resolution (a policy whose logged entropy did not move): np.polyfit then returned
  a confident a of either sign (−0.044 for a constant H, 4.5e5 for H varying in its 7th digit). A step whose H or R
  is not finite (train/entropy is NaN when none of the step's updates had a loss token) is left out: unlike the
  sigmoid's points no point here plays a part of its own."""
  x, y = np.exp(np.asarray(H, np.float64)), np.asarray(R, np.float64)
  ok = np.isfinite(x) & np.isfinite(y)
  x, y = x[ok], y[ok]
  if x.size < 2 or np.ptp(x) <= 8 * float(np.finfo(np.float32).eps) * float(np.max(np.abs(x))):
    return float("nan"), float("nan")
  xc = x - x.mean()
  slope = float(np.dot(xc, y - y.mean()) / np.dot(xc, xc))
  return -slope, float(y.mean() - slope * x.mean())


@dataclasses.dataclass(frozen=True)
class SeedFits:
  fits: tuple[SigmoidFit, ...]  # every seed's, flagged ones included
  A: stats.Summary              # over the unflagged fits only (n says how many; nan when none)
  B: stats.Summary
  C_mid: stats.Summary


def fit_seeds(C: Sequence[float], R_SxT: Sequence[Sequence[float]], R0: float | None = None,
              A_max: float | None = None) -> SeedFits:
  """One fit per seed's curve R_SxT[s] over the common compute points C: A, B, C_mid as mean ± 95% CI over the
  seeds whose fit is not flagged (`sum(f.edge for f in fits)` are left out; their values describe the box)."""
  fits = tuple(fit(C, r, R0, A_max) for r in R_SxT)
  ok = [f for f in fits if not f.edge]
  return SeedFits(fits, stats.summarize([f.A for f in ok]), stats.summarize([f.B for f in ok]),
                  stats.summarize([f.C_mid for f in ok]))
