#!/usr/bin/env bash
# Install the system packages the tests need besides the database servers:
# PgBouncer (tests/support/servers.py starts pgbouncer processes of its own; the Debian
# service is not used), the databases' command-line clients, which
# tests/adapters/test_ddl.py runs `sqla-queue ddl` output with (psql, mysql, sqlite3),
# and for the Spark tests a Java runtime and the JDBC drivers Spark reads the
# queue tables with (PySpark bundles none, and Maven is not reachable: Debian's
# jars, at the paths sqla_queue.spark looks at), and chromium with its driver
# for the dashboard's browser tests, and iptables for the partition tests. Does nothing when everything
# is there (no network call); when a package is missing, runs apt-get update
# first (a fresh machine's package lists are empty or stale: install alone
# fails there, or fetches versions the mirror no longer has), then apt-get
# install. When it cannot install (not root, no apt-get, no network) it says
# so and goes on: the tests that need the package then skip, or fail under
# SQLA_QUEUE_REQUIRE_DATABASES=1.
# Also the reference library's own venv (scripts/install-nsj-reference.sh).
set -u
"$(dirname "$0")/install-nsj-reference.sh"
PATH=$PATH:/usr/sbin:/sbin
missing=()
command -v pgbouncer >/dev/null 2>&1 || missing+=(pgbouncer)
command -v psql >/dev/null 2>&1 || missing+=(postgresql-client)
command -v mysql >/dev/null 2>&1 || missing+=(mariadb-client)
command -v sqlite3 >/dev/null 2>&1 || missing+=(sqlite3)
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
[ -f /usr/share/java/postgresql.jar ] || missing+=(libpostgresql-jdbc-java)
[ -f /usr/share/java/mariadb-java-client.jar ] || missing+=(libmariadb-java)
# the dashboard's browser tests (tests/acceptance/test_dashboard.py): Debian's
# chromium and its chromedriver, driven by Selenium (nothing downloads a browser)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
# the partition tests (tests/faults/test_partition.py) drop a worker's packets
# by its cgroup
command -v iptables >/dev/null 2>&1 || missing+=(iptables)
[ ${#missing[@]} -eq 0 ] && exit 0

warn() { echo "install-test-deps: $* (tests needing ${missing[*]} will skip)" >&2; exit 0; }
command -v apt-get >/dev/null 2>&1 || warn "no apt-get: install ${missing[*]} by hand"
sudo=()
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo=(sudo -n); else
    warn "not root: install ${missing[*]} by hand"
  fi
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
echo "install-test-deps: installing ${missing[*]}"
# a failed update (no network) is reported, and the install still tried: the
# packages may be in apt's cache
"${sudo[@]}" apt-get update -qq >"$log" 2>&1 || { cat "$log" >&2; echo "install-test-deps: apt-get update failed" >&2; }
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
  --no-install-recommends -o Dpkg::Use-Pty=0 "${missing[@]}" >"$log" 2>&1 ||
  { cat "$log" >&2; warn "apt-get install ${missing[*]} failed"; }
exit 0
