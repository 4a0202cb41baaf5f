"""What the kernel holds and names: tensors reached from objects, the namespace's summaries, IPython's own references."""
