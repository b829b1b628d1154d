"""The declaration file that `check` and `apply` are tested on: four filters, one in each state."""

from __future__ import annotations

from pathlib import Path

from tests.fixtures.redis import Cli
from tests.helpers.redis import add, client_of


def four_filters(server, tmp_path: Path, cli: Cli) -> Path:
    """healthy (as declared, 10% full), drifted (capacity 1,000 on the server, 2,000 declared),
    over (95% full, max 0.9) and missing (declared, never made)."""
    (tmp_path / "items.csv").write_text("id\n" + "".join(f"{i}\n" for i in range(100)))
    text = f"""\
version = 1

[profiles.default]
url = "{server.url}"

[filters.healthy]
capacity = 1000
error_rate = "1%"
thresholds.max = 0.9

[filters.drifted]
capacity = 2000
error_rate = "1%"
source.csv = "items.csv"

[filters.over]
capacity = 100
error_rate = "1%"
thresholds.max = 0.9

[filters.missing]
capacity = 1000
error_rate = "1%"
"""
    path = tmp_path / "bloomctl.toml"
    path.write_text(text)
    for key, capacity in (("healthy", 1000), ("drifted", 1000), ("over", 100)):
        created = cli("--url", server.url, "reserve", key, "-c", str(capacity), "-e", "1%", "--format", "json")
        assert created.exit_code == 0, created.output
    client = client_of(server)
    add(client, "healthy", range(100))
    add(client, "over", range(95))
    return path
