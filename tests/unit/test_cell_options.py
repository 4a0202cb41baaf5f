"""`%%gpumem` options without a shell: the messages a user reads, exactly."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError

from jupyter_gpumem.ipython.cell_options import CELL_HELP, HELP_SHOWN, parse_options
from jupyter_gpumem.units import SIZE_HELP, echoed


def _refusal(line: str) -> str:
    with pytest.raises(UsageError) as caught:
        parse_options(line)
    return str(caught.value)


def test_help_is_the_message_of_the_usage_error() -> None:
    assert HELP_SHOWN == f"help for %%gpumem (the cell was not run)\n\n{CELL_HELP}"
    assert _refusal("--help") == _refusal("-h") == HELP_SHOWN
    assert _refusal("--budget lots -h") == HELP_SHOWN  # help first, whatever else is wrong
    assert parse_options("--name -h").measuring.name == "-h"  # a value, not the option


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            "--budget lots",
            "--budget: 'lots' is not a size such as 512MiB, 16GiB, 2.5GB or 1000000 "
            "(units: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)",
        ),
        ("--budget 0", f"--budget: '0' must be greater than zero: give {SIZE_HELP}"),
        ("--budget 0.4", f"--budget needs at least one byte, got '0.4'; give {SIZE_HELP}"),
        ("--budget 1e400", f"--budget: '1e400' is not {SIZE_HELP}"),
        (
            "--budget " + "9" * 400,
            f"--budget: {echoed('9' * 400)} is more than 1 EiB: give {SIZE_HELP}",
        ),
    ],
)
def test_a_budget_error_says_what_is_allowed_once(line: str, message: str) -> None:
    shown = _refusal(line)
    assert shown == message
    assert shown.count("a size such as") == 1
