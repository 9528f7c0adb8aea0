"""The decoder: model, its config, attention backends, real models' shapes."""
