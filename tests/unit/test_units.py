import pytest

from jupyter_gpumem.units import format_bytes, format_seconds, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [("512MiB", 512 * 2**20), ("16GiB", 16 * 2**30), ("2.5GB", 2_500_000_000), ("1024", 1024),
     ("1 kib", 1024), (" 3TB ", 3 * 10**12)],
)  # fmt: skip
def test_parse_size_accepts_binary_and_decimal_units(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "12 parsecs", "-1GiB", "0", "1.2.3MB"])
def test_parse_size_rejects_with_the_allowed_forms(text: str) -> None:
    with pytest.raises(ValueError, match=r"512MiB|greater than zero"):
        parse_size(text)


def test_parse_size_says_what_is_allowed_exactly_once() -> None:
    from jupyter_gpumem.units import SIZE_HELP

    for text, message in [
        ("lots", f"'lots' is not {SIZE_HELP}"),
        ("0GiB", f"'0GiB' must be greater than zero: give {SIZE_HELP}"),
    ]:
        with pytest.raises(ValueError) as caught:
            parse_size(text)
        assert str(caught.value) == message
        assert str(caught.value).count("a size such as") == 1


def test_format_bytes() -> None:
    assert format_bytes(0) == "0 B"
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(15 * 2**30 + 2**29) == "15.5 GiB"
    assert format_bytes(-3 * 2**20, signed=True) == "-3.00 MiB"
    assert format_bytes(2**20, signed=True) == "+1.00 MiB"
    assert format_bytes(None) == "n/a"


def test_format_seconds() -> None:
    assert format_seconds(0.25) == "250 ms"
    assert format_seconds(3.4178) == "3.42 s"
    assert format_seconds(125) == "2 min 05 s"
