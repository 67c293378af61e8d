from decimal import Decimal

import pytest

from tessera.quantity import cpu_millis, memory_mib, parse_quantity, whole_count


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("100m", Decimal("0.1")),
        ("2", Decimal(2)),
        ("1.5Gi", Decimal(1.5 * 2**30)),
        ("1e3", Decimal(1000)),
        (3, Decimal(3)),
    ],
)
def test_parse_quantity(text: str | int, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("bad", ["", "1.2.3", "5 Gi", "Gi", None, True, [1]])
def test_bad_quantities(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_quantity(bad)


def test_conversions_round_up() -> None:
    assert cpu_millis("0.0001") == 1
    assert cpu_millis("250m") == 250
    assert memory_mib("1G") == 954
    assert memory_mib("64Mi") == 64
    assert whole_count("7") == 7
    with pytest.raises(ValueError):
        whole_count("7.5")
