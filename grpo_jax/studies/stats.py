"""Mean ± 95% confidence intervals over seeds (Student t), without SciPy.

The t quantile is found by bisection on the t CDF, which is written through the regularised incomplete beta function
(Lentz's continued fraction): small and exact to ~1e-10, so ablation tables need no SciPy dependency.
"""
import dataclasses
import math
from typing import Sequence

import numpy as np


def _betacf(a: float, b: float, x: float) -> float:
  """Continued fraction of the incomplete beta function (modified Lentz), as Numerical Recipes' `betacf` (Press et
  al., §6.4 "Incomplete Beta Function")."""
  tiny = 1e-300
  qab, qap, qam = a + b, a + 1.0, a - 1.0
  c, d = 1.0, 1.0 - qab * x / qap
  d = 1.0 / (d if abs(d) > tiny else tiny)
  h = d
  for m in range(1, 400):
    m2 = 2 * m
    aa = m * (b - m) * x / ((qam + m2) * (a + m2))
    d = 1.0 + aa * d
    d = 1.0 / (d if abs(d) > tiny else tiny)
    c = 1.0 + aa / c
    c = c if abs(c) > tiny else tiny
    h *= d * c
    aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
    d = 1.0 + aa * d
    d = 1.0 / (d if abs(d) > tiny else tiny)
    c = 1.0 + aa / c
    c = c if abs(c) > tiny else tiny
    delta = d * c
    h *= delta
    if abs(delta - 1.0) < 1e-14:
      break
  return h


def betainc(a: float, b: float, x: float) -> float:
  """Regularised incomplete beta I_x(a, b)."""
  if x <= 0.0:
    return 0.0
  if x >= 1.0:
    return 1.0
  log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
  if x < (a + 1.0) / (a + b + 2.0):
    return math.exp(log_front) * _betacf(a, b, x) / a
  return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
  """Student t CDF through the incomplete beta: P(|T| > |t|) = I_x(df/2, 1/2), x = df/(df + t²) (Abramowitz &
  Stegun 26.5.27)."""
  x = df / (df + t * t)
  tail = 0.5 * betainc(0.5 * df, 0.5, x)
  return 1.0 - tail if t >= 0 else tail


def t_quantile(q: float, df: float) -> float:
  """Inverse of t_cdf by bisection (monotone, so 200 halvings reach machine precision) in a bracket widened until
  it holds the quantile (t_{0.99999, 1} is 31831: a fixed ±1e3 returned 1e3)."""
  if not 0.0 < q < 1.0:
    raise ValueError(f"t_quantile: q={q} must lie in (0, 1).")
  if df <= 0:
    raise ValueError(f"t_quantile: df={df} must be positive (need at least 2 seeds).")
  hi = 1e3
  while t_cdf(hi, df) < max(q, 1.0 - q) and hi < 1e300:
    hi *= 1e3
  lo = -hi
  for _ in range(200):
    mid = 0.5 * (lo + hi)
    if t_cdf(mid, df) < q:
      lo = mid
    else:
      hi = mid
  return 0.5 * (lo + hi)


@dataclasses.dataclass(frozen=True)
class Summary:
  n: int
  mean: float
  std: float        # sample std (ddof=1); 0 for n = 1
  half_width: float  # 95% CI half-width t_{0.975, n−1}·std/√n; nan for n = 1 (no interval from one run)

  @property
  def low(self) -> float:
    return self.mean - self.half_width

  @property
  def high(self) -> float:
    return self.mean + self.half_width

  def fmt(self, digits: int = 4) -> str:
    if self.n < 2 or not math.isfinite(self.half_width):
      return _g(self.mean, digits)
    return f"{_g(self.mean, digits)} ± {_g(self.half_width, 2)}"


def _g(x: float, digits: int) -> str:
  if not math.isfinite(x):
    return str(x)
  return f"{x:.{digits}g}"


def summarize(values: Sequence[float], level: float = 0.95) -> Summary:
  """Mean ± CI over seeds; non-finite values are dropped (and so lower n)."""
  v = np.asarray([float(x) for x in values], np.float64)
  v = v[np.isfinite(v)]
  n = int(v.size)
  if n == 0:
    return Summary(0, float("nan"), float("nan"), float("nan"))
  mean = float(v.mean())
  if n == 1:
    return Summary(1, mean, 0.0, float("nan"))
  std = float(v.std(ddof=1))
  t = t_quantile(0.5 + level / 2.0, n - 1)
  return Summary(n, mean, std, t * std / math.sqrt(n))


def band(curves_SxT: np.ndarray, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
  """Per-column mean and CI half-width of seeds × steps curves (the shaded band of a plot). A NaN is a seed that
  measured nothing at that step (no right answer to take a length of): each column is over its finite seeds, as
  `summarize` is (NaN with none, half-width 0 with one)."""
  c = np.asarray(curves_SxT, np.float64)
  ok = np.isfinite(c)
  n_T = ok.sum(axis=0)
  x = np.where(ok, c, 0.0)
  mean = np.where(n_T > 0, x.sum(axis=0) / np.maximum(n_T, 1), np.nan)
  var = np.where(ok, (c - mean) ** 2, 0.0).sum(axis=0) / np.maximum(n_T - 1, 1)
  t_of = {n: t_quantile(0.5 + level / 2.0, n - 1) for n in set(n_T.tolist()) if n >= 2}  # one bisection per count
  t_T = np.array([t_of.get(n, 0.0) for n in n_T.tolist()])
  return mean, np.where(n_T >= 2, t_T * np.sqrt(var / np.maximum(n_T, 1)), 0.0)


def resolvable_difference(summaries: Sequence[Summary], level: float = 0.95) -> float:
  """Smallest difference between two cells this many seeds resolve: the CI half-width of a difference of two
  independent means (Welch, pooled over the cells' median variance): t_{df}·√(2 s²/n), df = 2(n−1)."""
  ok = [s for s in summaries if s.n >= 2 and math.isfinite(s.std)]
  if not ok:
    return float("nan")
  n = min(s.n for s in ok)
  s2 = float(np.median([s.std ** 2 for s in ok]))
  return t_quantile(0.5 + level / 2.0, 2 * (n - 1)) * math.sqrt(2.0 * s2 / n)


def welch(a: Summary, b: Summary, level: float = 0.95) -> tuple[float, float]:
  """(a.mean − b.mean, its CI half-width) for two independent groups of runs: Welch's t with the
  Welch–Satterthwaite degrees of freedom (nan half-width when either group has fewer than 2 runs)."""
  d = a.mean - b.mean
  if a.n < 2 or b.n < 2:
    return d, float("nan")
  va, vb = a.std ** 2 / a.n, b.std ** 2 / b.n
  if va + vb == 0:
    return d, 0.0
  df = (va + vb) ** 2 / (va ** 2 / (a.n - 1) + vb ** 2 / (b.n - 1))
  return d, t_quantile(0.5 + level / 2.0, df) * math.sqrt(va + vb)
