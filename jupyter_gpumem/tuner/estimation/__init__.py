"""Predictions on fake tensors: a step played without memory, the caching allocator modelled, per rank."""
