"""Worker processes of a measured cell: their reports read back as ranks, their tensors named."""
