"""The fixtures live in tests/fixtures/ (servers and the CLI, SQL services, report hooks)."""

pytest_plugins = ["tests.fixtures.redis", "tests.fixtures.sql", "tests.fixtures.report"]
