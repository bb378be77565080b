# Sourced by the enqueue scripts (bash): where the peer harness and the
# peers' venvs are (ROOT, HARNESS, VENVS), and how a system of it runs.
#   harness_system SYSTEM   sets PY (its python), ADAPTER (its adapter
#                           module) and PYPATH (the PYTHONPATH it needs)
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HARNESS=$(cd "${BENCH_HARNESS:-$ROOT/../shared/bench}" && pwd)
VENVS=${VENVS:-/tmp/bench-venvs}

harness_system() {
  case $1 in
    sqla_queue | sqla_queue_client)
      PY=$ROOT/.venv/bin/python ADAPTER=${1}_adapter PYPATH=$ROOT/benchmarks/peers:$HARNESS ;;
    *) PY=$VENVS/$1/bin/python ADAPTER=adapters.${1}_adapter PYPATH=$HARNESS ;;
  esac
}
