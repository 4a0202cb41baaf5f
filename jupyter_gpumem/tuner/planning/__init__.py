"""Choosing a configuration: the step profiled, the checkpointing plan solved, the fit among measured ones."""
