"""Spark builds, in local mode (a real JVM, real Python workers, ``mapInArrow``): bits equal to a
one-process client build on both backends and for a sharded filter, items repeated across
partitions, a failing task, and ``rebuild --engine spark``. CI runs them as a step of their own
(pyspark is a 490 MB wheel): with ``BLOOMCTL_TEST_SPARK=1`` a missing pyspark fails them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bloomctl.filters.bloom import Filter
from tests.test_distributed import members, write_parquet

pytestmark = pytest.mark.spark

if os.environ.get("BLOOMCTL_TEST_SPARK") == "1":
    import pyspark  # noqa: F401  (the Spark step: a missing pyspark fails)
else:
    pytest.importorskip("pyspark")
pa = pytest.importorskip("pyarrow")


@pytest.fixture(scope="module")
def spark():
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the workers need this interpreter's packages
    session = (
        SparkSession.builder.master("local[2]")
        .appName("bloomctl-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.mark.parametrize("sharded", [False, True], ids=["one", "sharded"])
def test_spark_builds_the_bits_of_a_client_build(target, spark, tmp_path, sharded):
    from bloomctl.distributed import spark as engine

    if target.cluster and not sharded:
        pytest.skip("one Cluster case is enough: the sharded one")
    items = [f"user{i}@example.com" for i in range(12_000)] + [None, ""] * 50
    path = write_parquet(tmp_path / "u.parquet", items)
    shards = ["--shards", "3"] if sharded else []
    args = ["--from-parquet", path, "--column", "email", "-c", "20000", "-e", "1%", "--nonscaling"]
    result = target.cli(
        "rebuild", "one", *args, "--backend", target.backend.name, "--swap", "--build", "client", *shards
    )
    assert result.exit_code == 0, result.stderr
    frame = spark.read.parquet(path).repartition(5)  # five input partitions, coalesced to two slots
    report = engine.build(
        frame,
        "email",
        key="spread",
        redis=target.client,
        capacity=20_000,
        error_rate=0.01,
        nonscaling=True,
        backend=target.backend.name,
        shards=3 if sharded else None,
        swap=True,
    )
    assert (report.swapped, report.source.items, report.source.blank) == (True, 12_000, 100)
    for one, spread in zip(members(target, "one"), members(target, "spread"), strict=True):
        assert target.dump(spread, header=False) == target.dump(one, header=False)
        assert target.card(one) <= target.card(spread) <= target.card(one) * 1.01


def test_items_in_two_partitions_and_a_failing_task(bloom, spark):
    """The same items in both partitions: the count is settled from the bits (a warning says so).
    Then a task that fails: the error reaches the caller, the active filter keeps its items, the
    lock is free for the next run."""
    from pyspark.sql import functions as F

    from bloomctl.distributed import spark as engine
    from bloomctl.server.connection import connect, settings_from

    client = connect(settings_from(bloom.url))
    items = [(f"user{i}@example.com",) for i in range(4000)]
    twice = spark.createDataFrame(items + items, "email string").repartition(2)
    said: list[str] = []
    options = {"redis": client, "capacity": 6000, "error_rate": 0.01, "nonscaling": True, "swap": True}
    engine.build(twice, "email", key="twice", events=lambda message, fields: said.append(message), **options)
    assert any("items repeated across parts" in line for line in said), said
    assert abs(int(client.execute_command("BF.CARD", "twice")) - 4000) <= 40

    failing = twice.withColumn(
        "email", F.when(F.col("email") == "user77@example.com", F.raise_error("bad disk")).otherwise(F.col("email"))
    )
    with pytest.raises(Exception, match="bad disk"):
        engine.build(failing, "email", key="twice", **options)
    assert all(Filter(client, "twice").mexists([f"user{i}@example.com" for i in range(0, 4000, 13)]))
    again = engine.build(twice, "email", key="twice", **options)
    assert again.swapped


def test_the_command_line_builds_with_spark(bloom, tmp_path):
    """`rebuild --engine spark --spark-master local[2]`: Spark's own Parquet reader, the bits of a
    client build."""
    from tests.fixtures.redis import Target

    target = Target("redisbloom", "standalone", bloom.url)
    items = [f"user{i}@x" if i % 10 else None for i in range(8000)]
    path = write_parquet(tmp_path / "u.parquet", items, 1000)
    args = ["--from-parquet", path, "--column", "email", "-e", "1%", "--swap", "--format", "json"]
    # a process of its own, without PYSPARK_PYTHON: the engine starts its own session
    environ = {name: value for name, value in os.environ.items() if name != "PYSPARK_PYTHON"}
    command = [sys.executable, "-m", "bloomctl", "--url", bloom.url, "rebuild", "spread", *args]
    spread = subprocess.run(
        [*command, "--engine", "spark", "--spark-master", "local[2]"], capture_output=True, text=True, env=environ
    )
    one = target.cli("rebuild", "one", *args, "--build", "client")
    assert spread.returncode == 0 and one.exit_code == 0, spread.stderr
    assert "building the bits on Spark (local[2])" in spread.stderr
    report = json.loads(spread.stdout)
    assert (report["items_read"], report["blank"]) == (7200, 800)
    assert target.dump("spread", header=False) == target.dump("one", header=False)
