#!/usr/bin/env bash
# PostgreSQL's server, for the PostgreSQL job store's tests (tests/jobs/): they start a
# throwaway server of their own with initdb and pg_ctl from Debian's postgresql package (its
# binaries under /usr/lib/postgresql/*/bin), and fail, naming this script, without them.
# psycopg, the store's client library, comes with the dev extra (scripts/setup.sh).
set -euo pipefail
if compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || command -v initdb >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
elif command -v sudo >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
else
    echo "setup_jobs: install PostgreSQL's server (the PostgreSQL job store's tests need initdb and pg_ctl)" >&2
    exit 1
fi
