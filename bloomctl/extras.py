"""The optional dependencies: which modules each feature needs, and the extra of redis-bloomctl that installs them.

Every place that needs an optional module asks here (``require`` before it imports, ``missing``
where it reports, as ``apply --dry-run``, ``check`` and ``config validate`` do), so that a module
that is not installed is always one line naming the extra, with exit code 9, and never a
traceback. A module is looked up with ``importlib.util.find_spec``, then imported: one that is
installed but fails to import (a wheel for another Python, a missing system library) is as
missing as an absent one, and the import's own error line says why. Nothing is imported when
this module loads: ``bloomctl --help`` loads none of them.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from bloomctl.errors import MissingExtra, first_line

DISTRIBUTION = "redis-bloomctl"  # the name pyproject.toml publishes: what `pip install` is given


@dataclass(frozen=True)
class Feature:
    """What a part of bloomctl needs beyond its dependencies."""

    needs: str  # the subject of "... need(s) it", as a message says it
    modules: tuple[str, ...]  # the import names, in the order a message names them
    extra: str  # the extra of pyproject.toml that installs them


# the name a message gives a module: the project's own spelling, or the extra's requirement
SHOWN = {
    "sqlalchemy": "SQLAlchemy",
    "pymysql": "PyMySQL",
    "adbc_driver_postgresql": "adbc-driver-postgresql",
    "adbc_driver_manager": "adbc-driver-manager",
    "dask.dataframe": "dask[dataframe]",
}

SQL, POSTGRESQL, MYSQL, ADBC = "sql", "postgresql", "mysql", "adbc"
PARQUET, CLIENT_BUILD, DASK, DASK_CLUSTER, SPARK = "parquet", "client-build", "dask", "dask-cluster", "spark"

FEATURES = {
    SQL: Feature("SQL sources need", ("sqlalchemy",), "sql"),
    POSTGRESQL: Feature("SQL sources on PostgreSQL need", ("sqlalchemy", "psycopg"), "postgresql"),
    MYSQL: Feature("SQL sources on MySQL and MariaDB need", ("sqlalchemy", "pymysql"), "mysql"),
    ADBC: Feature(
        "PostgreSQL through ADBC needs", ("adbc_driver_postgresql", "adbc_driver_manager", "pyarrow"), "fast"
    ),
    PARQUET: Feature("Parquet sources need", ("pyarrow",), "fast"),
    CLIENT_BUILD: Feature("a client build needs", ("numpy",), "fast"),
    DASK: Feature("Dask builds need", ("dask", "dask.dataframe", "pyarrow", "numpy"), "dask"),
    # distributed is slow to import, and only a build on a scheduler's cluster uses it
    DASK_CLUSTER: Feature("Dask builds on a scheduler need", ("distributed",), "dask"),
    SPARK: Feature("Spark builds need", ("pyspark", "pyarrow", "pandas", "numpy"), "spark"),
}


def install_command(extra: str) -> str:
    return f"pip install '{DISTRIBUTION}[{extra}]'"


def missing(name: str) -> MissingExtra | None:
    """Why the feature ``name`` cannot run here, as the error to raise or report: the modules that
    are absent, else the first that does not import. None when it can run."""
    feature = FEATURES[name]
    absent: list[str] = []
    for module in feature.modules:
        # a submodule of a package that is absent is absent with it: the package is named once
        if not _found(module) and module.split(".")[0] not in absent:
            absent.append(module)
    if absent:
        return _absent(feature, absent)
    for module in feature.modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:  # installed, but broken: its own words say why
            return _broken(feature, module, exc)
    return None


def require(name: str) -> None:
    """Raise ``MissingExtra`` unless the feature ``name`` can run here."""
    problem = missing(name)
    if problem is not None:
        raise problem


def available(name: str) -> bool:
    return missing(name) is None


def _found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # its package is absent, or was imported without a spec
        return False


def _shown(module: str) -> str:
    return SHOWN.get(module, module)


def _absent(feature: Feature, modules: list[str]) -> MissingExtra:
    shown = [_shown(module) for module in modules]
    names = shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} and {shown[-1]}"
    verb, pronoun = ("is", "it") if len(modules) == 1 else ("are", "them")
    install = install_command(feature.extra)
    # Every word of the template is ours: none comes from the user, so none needs passing as a value.
    return MissingExtra(
        f"{names} {verb} not installed ({feature.needs} {pronoun}): {install}", extra=feature.extra, install=install
    )


def _broken(feature: Feature, module: str, exc: ImportError) -> MissingExtra:
    install = f"pip install --force-reinstall '{DISTRIBUTION}[{feature.extra}]'"
    # The import's message is the library's (a path, a symbol): a value, never part of the template.
    return MissingExtra(
        f"{_shown(module)} is installed but does not import (%s); {feature.needs} it: {install}",
        first_line(exc),
        extra=feature.extra,
        install=install,
    )
