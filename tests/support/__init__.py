"""Stand-ins shared by the tests: the NVML stand-in (`nvml_fake`)."""
