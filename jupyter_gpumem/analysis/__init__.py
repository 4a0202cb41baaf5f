"""Pure functions over what a tracker recorded: replay, peaks, breakdown, tensor delta."""
