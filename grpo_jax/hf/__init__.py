"""Hugging Face checkpoints in and out, safetensors, export."""
