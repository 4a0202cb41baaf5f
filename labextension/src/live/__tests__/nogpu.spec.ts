import { whyNoGpu } from '../nogpu';

describe('whyNoGpu', () => {
  it('says what is missing, what still works and what to do, for each typed reason', () => {
    expect(whyNoGpu('library not found')).toBe(
      'No NVIDIA GPU is visible to this server (NVML: library not found). Reports of CPU ' +
        'tensors still appear below; run on a machine with an NVIDIA driver for live GPU gauges.'
    );
    expect(whyNoGpu('nvidia-ml-py not installed')).toContain('`pip install nvidia-ml-py`');
    expect(whyNoGpu('driver not loaded')).toContain('nvidia-smi');
    expect(whyNoGpu('no permission')).toContain('/dev/nvidia*');
    expect(whyNoGpu('driver/library version mismatch')).toContain('reboot');
  });

  it('still reads well for a reason it does not know, or none', () => {
    expect(whyNoGpu('gpu lost')).toBe(
      'No GPU can be read on this server (NVML: gpu lost). Reports of CPU tensors still ' +
        'appear below; live GPU gauges need an NVIDIA GPU and driver.'
    );
    expect(whyNoGpu(null)).toMatch(/^No GPU can be read on this server\. /);
  });
});
