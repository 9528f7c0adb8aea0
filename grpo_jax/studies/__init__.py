"""Many runs: vmapped runs, sweeps, ablations and their reports."""
