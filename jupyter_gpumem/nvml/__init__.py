"""NVML, read the same way by the server's live view and the kernel: the library wrapper
(`library`, the only ``pynvml`` importer, lazily), device numbering (`visibility`), the
sample records (`readings`) and the sampling thread (`sampler`). No Jupyter Server here."""
