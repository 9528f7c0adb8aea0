"""Sampling the completions: the decoder loop, where the weights live while it decodes."""
