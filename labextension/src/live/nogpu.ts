/**
 * Plain words for a server without a GPU view: why NVML gave nothing (the typed
 * `reason` of the server's sample JSON, see wire/live.ts) and what to do about it.
 * Shared by the sidebar and the status bar item's tooltip.
 */

/** What still works without a GPU, said once in every explanation. */
const STILL_WORKS = 'Reports of CPU tensors still appear below';

/** The sampler's answer before its first read: not a missing GPU. */
export const STARTING_REASON = 'sampler starting';

/** Reason text on the wire -> the situation, and what brings the live GPU gauges. */
const ADVICE: Record<string, { situation: string; fix: string }> = {
  'library not found': {
    situation: 'No NVIDIA GPU is visible to this server',
    fix: 'run on a machine with an NVIDIA driver for live GPU gauges'
  },
  'driver not loaded': {
    situation: 'The NVIDIA driver is not loaded on this server',
    fix: 'load it (`nvidia-smi` shows whether it works) for live GPU gauges'
  },
  'no permission': {
    situation: 'This server may not read the GPUs',
    fix: "give the server's user access to /dev/nvidia* for live GPU gauges"
  },
  'nvidia-ml-py not installed': {
    situation: "NVML's Python bindings are missing from the server's environment",
    fix: '`pip install nvidia-ml-py` and restart the server for live GPU gauges'
  },
  'driver/library version mismatch': {
    situation: 'The NVIDIA driver and its library differ in version (usually after an update)',
    fix: 'reload the driver or reboot for live GPU gauges'
  }
};

/**
 * One sentence or two on why there is no GPU view and what to do, e.g. "No NVIDIA
 * GPU is visible to this server (NVML: library not found). Reports of CPU tensors
 * still appear below; run on a machine with an NVIDIA driver for live GPU gauges."
 */
export function whyNoGpu(reason: string | null): string {
  const known = reason ? ADVICE[reason] : undefined;
  if (known) {
    return `${known.situation} (NVML: ${reason}). ${STILL_WORKS}; ${known.fix}.`;
  }
  const said = reason ? ` (NVML: ${reason})` : '';
  return `No GPU can be read on this server${said}. ${STILL_WORKS}; live GPU gauges need an NVIDIA GPU and driver.`;
}
