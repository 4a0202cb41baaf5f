"""The tuner's engine: trials of configurations on a model, and the choice within a budget."""
