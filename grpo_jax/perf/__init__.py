"""TPU compile checks, roofline, collectives, FLOPs."""
