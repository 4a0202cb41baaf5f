"""The IPython front door: `%%gpumem` and `%gpumem` (``magic``), their options, the cell run, the display."""
