"""One run: the training loop, jobs and stages, input checks, evaluation, metrics, plots."""
