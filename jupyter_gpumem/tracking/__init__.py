"""Event sources that record while a cell runs: the CUDA allocator trace and counters."""
