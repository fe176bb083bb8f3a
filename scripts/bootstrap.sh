#!/usr/bin/env bash
# Set up everything `make demo` and `make test` need on a fresh machine:
# a virtual environment with millstream and its extras, redis-server, and a Java 17+ check.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}

say() { printf '[bootstrap] %s\n' "$*"; }

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  say "Python 3.11+ is required (found: $("$PYTHON" --version 2>&1)). Install python3.11 and re-run."
  exit 1
fi

apt_install() {
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1 && [ "${MILLSTREAM_NO_APT:-}" != "1" ]; then
    say "installing $* with apt-get"
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
  else
    say "missing: $*. Install it (e.g. 'sudo apt-get install -y $*') and re-run."
    exit 1
  fi
}

command -v redis-server >/dev/null 2>&1 || apt_install redis-server
command -v make >/dev/null 2>&1 || apt_install make
if ! command -v java >/dev/null 2>&1; then
  apt_install openjdk-17-jre-headless
fi
java_major=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1)
if [ -z "$java_major" ] || [ "$java_major" -lt 17 ]; then
  say "Java 17+ is required by Spark 4 (found: ${java_major:-none}). Install openjdk-17-jre-headless."
  exit 1
fi

stamp="$VENV/.millstream-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  say "installing millstream and its test/demo extras into $VENV (first run takes a few minutes)"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -e '.[test,demo]'
  touch "$stamp"
fi
# Spark's driver JVM starts about 4 s sooner from a class archive (millstream/jvm_archive.py);
# built once per Java and PySpark, a failure only costs that time.
if [ "${MILLSTREAM_JVM_ARCHIVE:-auto}" != "off" ]; then
  if ! "$VENV/bin/python" -c 'import sys, millstream.jvm_archive as a; p = a.archive_path(); sys.exit(0 if p and p.is_file() else 1)'; then
    say "building the JVM class archive for faster Spark start-ups (once, about a minute)"
  fi
  say "$("$VENV/bin/python" -m millstream.jvm_archive)" || true
fi
say "ready: $("$VENV/bin/python" --version), java $java_major, $(redis-server --version | sed 's/.*v=\([0-9.]*\).*/redis \1/')"
