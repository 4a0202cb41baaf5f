"""The one error of the fake-tensor estimates: a step that cannot run on fake tensors."""


class Unfakeable(Exception):
    """The step cannot run on fake tensors; the message says why, in the user's terms."""
