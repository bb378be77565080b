#!/usr/bin/env bash
# Start the local PostgreSQL and MariaDB servers if they are installed and down,
# then wait (with a deadline) until they answer. Servers named by
# SQLA_QUEUE_TEST_POSTGRES_URL / SQLA_QUEUE_TEST_MYSQL_URL are left alone.
set -u
wait_for() {  # name, command...
  local name=$1; shift
  for _ in $(seq 1 60); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  echo "start-databases: $name did not answer within 30 s" >&2
  return 1
}
if [ -z "${SQLA_QUEUE_TEST_POSTGRES_URL:-}" ] && command -v pg_ctlcluster >/dev/null 2>&1; then
  if ! pg_isready -q -h 127.0.0.1 -p 5432; then
    echo "start-databases: starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start || true
    wait_for PostgreSQL pg_isready -q -h 127.0.0.1 -p 5432
  fi
fi
if [ -z "${SQLA_QUEUE_TEST_MYSQL_URL:-}" ] && [ -x /usr/sbin/mariadbd ]; then
  if ! mysqladmin --protocol=tcp -h 127.0.0.1 -P 3306 -u root ping >/dev/null 2>&1; then
    echo "start-databases: starting MariaDB"
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd || true
    wait_for MariaDB mysqladmin --protocol=tcp -h 127.0.0.1 -P 3306 -u root ping
  fi
fi
exit 0
