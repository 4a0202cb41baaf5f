"""Stand-ins and helpers shared by the tests: the NVML stand-in (`nvml_fake`), the bytes
modules save (`saved_bytes`), the garbage a cell leaves in cycles (`cycles`)."""
