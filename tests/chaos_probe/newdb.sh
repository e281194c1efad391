#!/bin/sh
# Usage: tests/chaos_probe/newdb.sh <dbname>   (drops and re-creates it, then migrates)
set -e
cd "$(dirname "$0")/../.."
dropdb -h 127.0.0.1 -U postgres --if-exists --force "$1"
createdb -h 127.0.0.1 -U postgres "$1"
DATABASE_URL="postgresql://postgres@127.0.0.1:5432/$1" .venv/bin/python manage.py migrate -v0
