"""docs/operations.md run as written: every recipe, from a fresh venv, on this machine without changing it.

The page's set-up runs as root and writes to /opt, /etc and /var. Each command here runs in a
private mount namespace (`unshare --mount`) where those three are overlays: what the recipes
write (the venv in /opt/bloomctl, the `bloomctl` user, /etc/bloomctl, the logs and metrics under
/var) lands in the test's directory and is gone with it. The network is the machine's, so pip
reaches its indexes; the overlay's /etc/hosts points the page's Redis names at a throwaway
redis-server on 127.0.0.2:6379, and the SQL recipes read the machine's PostgreSQL, in a database
of the test's own.

Each block runs the way the page says it runs: set-up blocks as root through bash from a checkout
(a copy of this working tree, so that pip's in-tree build leaves nothing in it); cron lines as
cron runs them, as the line's user under `env -i` with cron's variables and the file's, through
/bin/sh -c; a Kubernetes container's command as the pod's non-root user with the variables its
Secret gives, the cron set-up's venv standing for the image. The test supplies only what the page
says the user supplies: the password typed into `install`, the night's export, `shop.env` and
the Secrets' values. There is no cluster: the kubectl lines are checked against the manifests and
the file instead of run.

Needs root, unshare and overlayfs: without them the tests skip, and under CI=true they fail.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import pwd
import re
import shlex
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bloomctl import backends
from bloomctl.declared.config import load
from tests.servers import REDIS_SERVER, REDIS_SERVER_MISSING, in_ci

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "operations.md"
EXAMPLE = ROOT / "examples" / "bloomctl.toml"
LAYERS = ("etc", "opt", "var")
# The machine's own Redis binds 127.0.0.1 only, so this address and port are the test's.
REDIS_ADDRESS, REDIS_PORT = "127.0.0.2", 6379
# The Redis host names the page uses, which the namespace's /etc/hosts gives the throwaway server.
REDIS_NAMES = ("redis.internal", "redis.cache.svc.cluster.local")
PASSWORD = "ops-recipes-secret"
DATABASE = "bloomctl_ops_recipes"
ROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # a root shell's, on Debian
CRON_PATH = "/usr/bin:/bin"  # what cron gives a job when its file sets no PATH
IMAGE_PATH = f"/opt/bloomctl/bin:{ROOT_PATH}"  # the image: bloomctl installed, and on its PATH
EXPORT_ROWS = 1000  # the night's export of users
TABLE_ROWS = 5000  # the application's users table; one row in ten is deleted


def require(ok: object, why: str) -> None:
    if not ok:
        if in_ci():
            pytest.fail(why)
        pytest.skip(why)


# --- the page ------------------------------------------------------------------------------------


def section(heading: str) -> str:
    page = PAGE.read_text(encoding="utf-8")
    assert f"\n## {heading}\n" in page, f"docs/operations.md has no section {heading!r}"
    return page.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def block_with(text: str, pattern: str, language: str = "sh") -> str:
    """The one fenced block of `language` in which the regular expression `pattern` matches a line."""
    found = [b for b in re.findall(rf"^```{language}\n(.*?)^```", text, re.M | re.S) if re.search(pattern, b, re.M)]
    assert len(found) == 1, f"expected one {language} block matching {pattern!r}, found {len(found)}"
    return found[0]


def cron_file(text: str) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """A /etc/cron.d file: its variables, and each job's user and command."""
    variables: dict[str, str] = {}
    jobs = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if assignment := re.fullmatch(r"([A-Za-z_]\w*)=(.*)", line):
            variables[assignment[1]] = assignment[2]
            continue
        *when, user, command = line.split(None, 6)
        assert len(when) == 5, f"not a cron.d job line: {line}"
        # cron turns an unescaped % into a newline and hands the rest to the job's stdin
        assert "%" not in command, f"cron would cut this command at its %: {line}"
        jobs.append((user, command))
    return variables, jobs


def kubectl_creates(block: str) -> dict[str, tuple[str, dict[str, str]]]:
    """Each `kubectl create` line of a block: its kind (configmap, secret), name, and KEY=VALUE options."""
    created = {}
    for line in block.replace("\\\n", " ").splitlines():
        words = shlex.split(line)
        assert words[:2] == ["kubectl", "create"], line
        kind, option = ("secret", "--from-literal=") if words[2] == "secret" else ("configmap", "--from-file=")
        name_at = 4 if kind == "secret" else 3
        assert words[2:name_at] == (["secret", "generic"] if kind == "secret" else ["configmap"]), line
        options = words[name_at + 1 :]
        assert options and all(o.startswith(option) and "=" in o[len(option) :] for o in options), line
        pairs = dict(o[len(option) :].split("=", 1) for o in options)
        # the key rule of the API server: a ConfigMap or Secret key is no path
        assert all(re.fullmatch(r"[-._a-zA-Z0-9]+", key) for key in pairs), line
        created[kind] = (words[name_at], pairs)
    return created


# --- the machine ---------------------------------------------------------------------------------


def root_env() -> dict[str, str]:
    """A root shell's environment: this process's, less what points at the test run's venv and servers."""
    kept = {k: v for k, v in os.environ.items() if not k.startswith(("BLOOMCTL_", "PYTHON", "VIRTUAL_ENV", "PYTEST"))}
    return {**kept, "PATH": ROOT_PATH}


class Machine:
    """This machine as the page's recipes see it: /etc, /opt and /var are overlays of the test's."""

    def __init__(self, top: Path, checkout: Path) -> None:
        self.top, self.checkout = top, checkout
        for layer in LAYERS:
            (top / f"{layer}-up").mkdir()
            (top / f"{layer}-work").mkdir()

    def run(self, argv: list[str], *, stdin: str = "", env: dict[str, str] | None = None, before: str = ""):
        """`argv` as root in a new mount namespace; `before`: shell lines run there first."""
        overlays = "".join(
            f"mount -t overlay overlay -o lowerdir=/{layer},upperdir={self.top}/{layer}-up,"
            f"workdir={self.top}/{layer}-work /{layer}\n"
            for layer in LAYERS
        )
        script = f'set -e\n{overlays}{before}\nexec "$@"\n'
        return subprocess.run(
            ["unshare", "--mount", "--fork", "--", "/bin/sh", "-c", script, "sh", *argv],
            input=stdin,
            env=env or root_env(),
            cwd=self.checkout,
            capture_output=True,
            text=True,
            timeout=900,
        )

    def bash(self, block: str, *, stdin: str = "", env: dict[str, str] | None = None):
        """A block of the page, as root pasting it into bash at the checkout's root would run it."""
        return self.run(["bash", "-e", "-o", "pipefail", "-c", block], stdin=stdin, env=env)

    def file(self, path: str) -> Path:
        """A file a recipe wrote under /etc, /opt or /var, where the overlay keeps it."""
        layer, rest = path.lstrip("/").split("/", 1)
        assert layer in LAYERS, path
        return self.top / f"{layer}-up" / rest

    def cron_job(self, variables: dict[str, str], user: str, command: str):
        """One job line as cron runs it: as its user, with only cron's variables and the file's."""
        home = self.run(["getent", "passwd", user]).stdout.split(":")[5]
        env = {"SHELL": "/bin/sh", "HOME": home, "LOGNAME": user, "PATH": CRON_PATH, **variables}
        pairs = [f"{k}={v}" for k, v in env.items()]
        return self.run(["runuser", "-u", user, "--", "env", "-i", *pairs, "/bin/sh", "-c", command])

    def pod(self, pod: dict, env: dict[str, str], before: str = ""):
        """The pod's one container's command, as its non-root user, with no shell, from the image's PATH."""
        assert pod["securityContext"]["runAsNonRoot"] is True
        uid = str(pod["securityContext"]["runAsUser"])
        (container,) = pod["containers"]
        pairs = [f"{k}={v}" for k, v in {"PATH": IMAGE_PATH, "HOME": "/", **env}.items()]
        argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", "env", "-i", *pairs]
        return self.run([*argv, *container["command"]], before=before)


def copy_checkout(to: Path) -> Path:
    """The working tree as it stands (tracked and new files, nothing git ignores)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True
    )
    assert listed.returncode == 0, listed.stderr
    for name in filter(None, listed.stdout.decode().split("\0")):
        if (ROOT / name).is_file():
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, to / name)
    return to


def missing_tools() -> str | None:
    if os.geteuid() != 0:
        return "the page's set-up runs as root (useradd, /opt, /etc): run as root"
    for tool in ("unshare", "mount", "runuser", "setpriv", "useradd", "getent", "git"):
        if not shutil.which(tool, path=ROOT_PATH):
            return f"{tool} is not installed"
    if "\toverlay\n" not in Path("/proc/filesystems").read_text():
        return "the kernel has no overlayfs"
    if not Path("/usr/bin/python3").exists():
        return "the page makes its venv with /usr/bin/python3, which is not installed"
    if Path("/opt/bloomctl").exists():
        return "this machine has /opt/bloomctl: the page's venv would not be a fresh one"
    try:
        pwd.getpwnam("bloomctl")
    except KeyError:
        return None
    return "this machine has a user `bloomctl`: the page's useradd would fail on it"


@pytest.fixture(scope="module")
def redis_internal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[redis.Redis]:
    """The server the page calls redis.internal: a throwaway one, with a password."""
    require(REDIS_SERVER, REDIS_SERVER_MISSING)
    try:
        socket.create_connection((REDIS_ADDRESS, REDIS_PORT), timeout=1).close()
    except OSError:
        pass
    else:
        pytest.fail(f"{REDIS_ADDRESS}:{REDIS_PORT} is taken: the page's Redis needs it (another run of this test?)")
    where = tmp_path_factory.mktemp("redis-internal")
    listen = ["--bind", REDIS_ADDRESS, "--port", str(REDIS_PORT), "--requirepass", PASSWORD]
    keep = ["--save", "", "--appendonly", "no", "--dir", str(where), "--logfile", str(where / "redis.log")]
    server = subprocess.Popen([REDIS_SERVER, *listen, *keep], stdout=subprocess.DEVNULL)
    client = redis.Redis(host=REDIS_ADDRESS, port=REDIS_PORT, password=PASSWORD, socket_timeout=30)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert server.poll() is None and time.monotonic() < deadline, (where / "redis.log").read_text()
                time.sleep(0.05)
        yield client
    finally:
        client.close()
        server.terminate()
        server.wait(10)


def user_id(n: int) -> str:
    """The id of the table's user n: a uuid, as many applications key their users."""
    return str(uuid.UUID(hashlib.md5(str(n).encode()).hexdigest()))


@pytest.fixture(scope="module")
def app_db(pg_engine) -> Iterator[str]:
    """The application's database: a `users` table (id, deleted_at) of TABLE_ROWS rows, one in ten
    deleted. Its ids are uuids, a column type only psycopg reads: the page's `postgresql` extra."""
    import sqlalchemy

    def admin(statement: str) -> None:
        with pg_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql(statement)

    admin(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
    admin(f"CREATE DATABASE {DATABASE}")
    url = pg_engine.url.set(drivername="postgresql", database=DATABASE)  # the page's form of URL
    engine = sqlalchemy.create_engine(url.set(drivername=pg_engine.url.drivername))
    with engine.begin() as conn:
        conn.execute(sqlalchemy.text("CREATE TABLE users (id uuid PRIMARY KEY, deleted_at timestamptz)"))
        rows = "SELECT md5(g::text)::uuid, CASE WHEN g % 10 = 0 THEN now() END FROM generate_series(1, :n) g"
        conn.execute(sqlalchemy.text(f"INSERT INTO users {rows}"), {"n": TABLE_ROWS})
    engine.dispose()
    yield url.render_as_string(hide_password=False)
    admin(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Machine]:
    """A machine after the Cron section's set-up block: a fresh venv in /opt/bloomctl, the
    `bloomctl` user, the password file (what the test types into `install`) and the log and
    textfile directories. Every recipe test starts from it."""
    require(not (why := missing_tools()), why or "")
    top = tmp_path_factory.mktemp("machine")
    machine = Machine(top, copy_checkout(top / "checkout"))
    probe = machine.run(["true"])
    require(probe.returncode == 0, f"no private mount namespace with overlays here: {probe.stderr.strip()}")
    hosts = "".join(f"{REDIS_ADDRESS} {name}\n" for name in REDIS_NAMES)
    assert machine.run(["sh", "-c", "cat >>/etc/hosts"], stdin=hosts).returncode == 0
    done = machine.bash(block_with(section("Cron"), r"python3 -m venv"), stdin=f"{PASSWORD}\n")
    assert done.returncode == 0, done.stderr[-4000:]
    yield machine
    shutil.rmtree(top / "opt-up", ignore_errors=True)  # the venv: hundreds of megabytes


# --- what the recipes did --------------------------------------------------------------------------


def sample(text: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and labels.items() <= s.labels.items():
                return s.value
    return None


def card(client: redis.Redis, key: str) -> int:
    return backends.for_key(client, key.encode()).card(client, key.encode())


def contains(client: redis.Redis, key: str, items: list[str]) -> list[bool]:
    raw = key.encode()
    return list(backends.for_key(client, raw).mexists(client, raw, [i.encode() for i in items]))


def assert_the_venv_is_the_image() -> None:
    """The page's image installs what the Cron set-up installed, so /opt/bloomctl stands for it."""
    (image,) = re.findall(r"image with `pip install '([^']+)'`", section("Kubernetes CronJob"))
    (installed,) = re.findall(r"/opt/bloomctl/bin/pip install '([^']+)'", section("Cron"))
    assert image == installed


def reserve_users(machine: Machine, client: redis.Redis) -> None:
    """bf:users as the nightly rebuild finds it: created once with the Cron section's line."""
    client.flushdb()
    created = machine.bash(block_with(section("Cron"), r"\breserve\b"))
    assert created.returncode == 0, created.stderr
    assert client.exists("bf:users") and card(client, "bf:users") == 0


def assert_the_shops_filters(client: redis.Redis) -> None:
    """The example file's filters, built: users not deleted from the table, every SKU of the export."""
    skus = len((ROOT / "examples" / "data" / "skus.csv").read_text().splitlines()) - 1
    assert card(client, "shop:{users}") == TABLE_ROWS - TABLE_ROWS // 10
    # user 10 is one of the deleted
    assert contains(client, "shop:{users}", [f"user:{user_id(1)}", f"user:{user_id(10)}"]) == [True, False]
    assert card(client, "shop:{skus}") == skus
    assert client.keys("shop:dedupe*"), "the window was not created"


# --- the recipes ---------------------------------------------------------------------------------


def test_the_completion_lines_write_scripts_and_bash_completes(machine: Machine, tmp_path: Path) -> None:
    page = section("Shell completion")
    home = tmp_path / "home"
    home.mkdir()
    env = {**root_env(), "HOME": str(home), "PATH": IMAGE_PATH}
    for shell, script in (
        ("bash", ".bloomctl-complete.bash"),
        ("zsh", ".bloomctl-complete.zsh"),
        ("fish", ".config/fish/completions/bloomctl.fish"),
    ):
        ran = machine.bash(block_with(page, rf"={shell}_source "), env=env)
        assert ran.returncode == 0, (shell, ran.stderr)
        assert "_BLOOMCTL_COMPLETE" in (home / script).read_text(), shell
    # what the bash lines added to ~/.bashrc loads the script, and a Tab after `bloomctl re` offers both
    tab = '. ~/.bashrc; COMP_WORDS=(bloomctl re); COMP_CWORD=1; _bloomctl_completion bloomctl; echo "${COMPREPLY[@]}"'
    completed = machine.run(["bash", "-c", tab], env=env)
    assert completed.returncode == 0, completed.stderr
    assert {"rebuild", "reserve"} <= set(completed.stdout.replace("plain,", "").split()), completed.stdout
    # the check without a terminal prints what the page shows under it
    check = block_with(page, r"=bash_complete ")
    shown = [line[2:] for line in check.splitlines() if line.startswith("# ")]
    printed = machine.bash(check, env=env)
    assert printed.returncode == 0 and printed.stdout.splitlines() == shown, printed.stdout + printed.stderr


def test_the_cron_jobs_rebuild_and_watch_as_cron_runs_them(machine: Machine, redis_internal: redis.Redis) -> None:
    page = section("Cron")
    # the night's export the rebuild reads, which the application writes: gzipped CSV, a user_id column
    export = machine.top / "users.csv.gz"
    export.write_bytes(gzip.compress(("user_id\n" + "".join(f"{i}\n" for i in range(1, EXPORT_ROWS + 1))).encode()))
    placed = machine.run(["install", "-D", "-m", "0644", str(export), "/var/lib/app/users.csv.gz"])
    assert placed.returncode == 0, placed.stderr
    reserve_users(machine, redis_internal)
    variables, jobs = cron_file(block_with(page, r"^SHELL="))
    (rebuild,) = [job for job in jobs if " rebuild " in job[1]]
    (fill,) = [job for job in jobs if " fill-ratio " in job[1]]
    textfile = variables["TEXTFILE"]

    ran = machine.cron_job(variables, *rebuild)
    log = machine.file("/var/log/bloomctl/rebuild-users.log")
    assert ran.returncode == 0, ran.stderr + (log.read_text() if log.exists() else "")
    assert ran.stdout == ran.stderr == ""  # cron mails what a job prints
    assert card(redis_internal, "bf:users") == EXPORT_ROWS  # the export, swapped in
    assert contains(redis_internal, "bf:users", ["user:1", f"user:{EXPORT_ROWS}", "user:0"]) == [True, True, False]
    assert json.loads(machine.file("/var/log/bloomctl/rebuild-users.json").read_text())["swapped"] is True
    metrics = machine.file(f"{textfile}/bloomctl-rebuild-users.prom").read_text()
    assert sample(metrics, "bloomctl_rebuild_exit_code", key="bf:users") == 0, metrics

    ran = machine.cron_job(variables, *fill)
    assert ran.returncode == 0 and ran.stdout == ran.stderr == "", ran.stdout + ran.stderr
    metrics = machine.file(f"{textfile}/bloomctl.prom").read_text()
    assert sample(metrics, "bloomctl_fill_ratio_exit_code") == 0, metrics
    assert sample(metrics, "bloomctl_fill_ratio", key="bf:users") is not None, metrics
    assert PASSWORD not in metrics + log.read_text()


def test_the_kubernetes_cronjob_fails_fast_where_a_retry_cannot_help_and_its_command_runs(
    machine: Machine, redis_internal: redis.Redis, app_db: str
) -> None:
    page = section("Kubernetes CronJob")
    secret, cronjob = yaml.safe_load_all(block_with(page, r"^kind: CronJob", "yaml"))
    assert (secret["kind"], cronjob["kind"], cronjob["apiVersion"]) == ("Secret", "CronJob", "batch/v1")
    job = cronjob["spec"]["jobTemplate"]["spec"]
    pod = job["template"]["spec"]
    (container,) = pod["containers"]
    # usage, a guard, verification, the source, a missing dependency (docs/commands.md's exit codes):
    # a retry changes none of them; a connection error (3) it may
    (rule,) = job["podFailurePolicy"]["rules"]
    assert rule["action"] == "FailJob" and rule["onExitCodes"]["containerName"] == container["name"]
    assert sorted(rule["onExitCodes"]["values"]) == [2, 5, 7, 8, 9]
    assert_the_venv_is_the_image()
    # the Secret's values are the user's (the test's server and database); its keys are the page's
    values = {"redis-url": secret["stringData"]["redis-url"], "redis-password": PASSWORD, "db-url": app_db}
    assert values.keys() == secret["stringData"].keys()
    assert urlsplit(values["redis-url"]).hostname in REDIS_NAMES
    env = {}
    for variable in container["env"]:
        ref = variable["valueFrom"]["secretKeyRef"]
        assert ref["name"] == secret["metadata"]["name"], ref
        env[variable["name"]] = values[ref["key"]]

    reserve_users(machine, redis_internal)
    ran = machine.pod(pod, env)
    assert ran.returncode == 0, ran.stderr[-4000:]
    assert card(redis_internal, "bf:users") == TABLE_ROWS  # `SELECT id FROM users`: every row
    assert contains(redis_internal, "bf:users", [f"user:{user_id(1)}", f"user:{user_id(TABLE_ROWS)}"]) == [True, True]
    assert PASSWORD not in ran.stdout + ran.stderr


def test_one_file_per_application_from_cron(machine: Machine, redis_internal: redis.Redis, app_db: str) -> None:
    page = section("One file per application")
    redis_internal.flushdb()
    # what the user types into `install ... /dev/stdin`: the file's two secrets
    typed = f"SHOP_REDIS_PASSWORD={PASSWORD}\nSHOP_DB_URL={app_db}\n"
    installed = machine.bash(block_with(page, r"^install "), stdin=typed)
    assert installed.returncode == 0, installed.stderr
    # the installed file's server is the cron jobs' (never the machine's own Redis on 127.0.0.1)
    shop = load(machine.file("/etc/bloomctl/shop.toml"))
    assert {urlsplit(p.url).hostname for p in shop.profiles.values()} <= set(REDIS_NAMES), shop.profiles
    variables, [(user, command)] = cron_file(block_with(page, r"^SHELL="))

    ran = machine.cron_job(variables, user, command)
    log = machine.file("/var/log/bloomctl/shop.log")
    assert ran.returncode == 0, log.read_text() if log.exists() else ran.stderr
    assert ran.stdout == ran.stderr == ""
    metrics = machine.file(f"{variables['TEXTFILE']}/bloomctl-shop.prom").read_text()
    assert sample(metrics, "bloomctl_rebuild_all_exit_code") == 0, metrics
    for key in ("shop:{users}", "shop:{skus}"):
        assert sample(metrics, "bloomctl_rebuild_exit_code", key=key) == 0, metrics
    assert_the_shops_filters(redis_internal)
    assert PASSWORD not in metrics + log.read_text()


def test_one_file_per_application_as_a_kubernetes_cronjob(
    machine: Machine, redis_internal: redis.Redis, app_db: str
) -> None:
    page = section("One file per application")
    created = kubectl_creates(block_with(page, r"^kubectl "))
    (cronjob,) = yaml.safe_load_all(block_with(page, r"^kind: CronJob", "yaml"))
    pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (volume,) = pod["volumes"]
    (mount,) = container["volumeMounts"]
    # the ConfigMap: its files from the checkout, shown at the mount path by key or by each item's path
    configmap, files = created["configmap"]
    assert volume["configMap"]["name"] == configmap and mount["name"] == volume["name"]
    items = volume["configMap"].get("items") or [{"key": key, "path": key} for key in files]
    shown = {item["path"]: machine.checkout / files[item["key"]] for item in items}
    args = container["command"]
    assert Path(args[args.index("--config") + 1]).relative_to(mount["mountPath"]).as_posix() in shown
    # the Secret: its keys are the variables the file names; its values are the user's
    secret, literals = created["secret"]
    assert container["envFrom"] == [{"secretRef": {"name": secret}}]
    declared = load(EXAMPLE)
    named = {p.password_env for p in declared.profiles.values()}
    named |= {f.source["db_url_env"] for f in declared.filters.values() if "db_url_env" in f.source}
    env = {"SHOP_REDIS_PASSWORD": PASSWORD, "SHOP_DB_URL": app_db}
    assert literals.keys() == named == env.keys()
    assert_the_venv_is_the_image()
    # the cluster's Redis is the command's --url, the test's server by the namespace's /etc/hosts
    assert urlsplit(args[args.index("--url") + 1]).hostname in REDIS_NAMES

    # the volume as the kubelet makes it: read-only, the files 0644
    volume_dir = machine.top / "configmap"
    for path, source in shown.items():
        (volume_dir / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, volume_dir / path)
        (volume_dir / path).chmod(0o644)
    target = shlex.quote(mount["mountPath"])
    before = f"mkdir -p {target}\nmount -t tmpfs -o mode=0755 configmap {target}\n"
    before += f"cp -a {volume_dir}/. {target}/\nmount -o remount,ro {target}\n"
    redis_internal.flushdb()  # the first run: every filter is built
    ran = machine.pod(pod, env, before=before)
    assert ran.returncode == 0, ran.stdout + ran.stderr[-4000:]
    assert json.loads(ran.stdout.splitlines()[-1])["exit_code"] == 0, ran.stdout
    assert_the_shops_filters(redis_internal)


def test_the_alerts_lines_pass_from_a_checkout(tmp_path: Path) -> None:
    page = section("Alerts")
    require(shutil.which("promtool", path=ROOT_PATH), "promtool is not installed (Debian's prometheus package)")
    ran = subprocess.run(
        ["bash", "-e", "-c", block_with(page, r"^promtool ")],
        cwd=ROOT,
        env=root_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    # prometheus.yml as shown, the rules file copied beside it as the page says
    (tmp_path / "prometheus.yml").write_text(block_with(page, r"^rule_files:", "yaml"))
    shutil.copy(ROOT / "examples" / "prometheus" / "bloomctl-rules.yml", tmp_path)
    checked = subprocess.run(
        ["promtool", "check", "config", str(tmp_path / "prometheus.yml")],
        env=root_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
