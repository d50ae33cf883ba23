#!/usr/bin/env bash
# Build the documentation site (user guide + API reference) into docs/_build/html.
# Warnings are errors: a broken cross-reference or a malformed docstring fails the build.
# Needs the docs extra: pip install -e '.[all,docs]'.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
rm -rf "$here/_build" "$here/api/_generated"
export MPLBACKEND=Agg PYTHONWARNINGS="${PYTHONWARNINGS:-ignore::DeprecationWarning}"
python -m sphinx -W --keep-going -q -j "${DOCS_JOBS:-1}" -b html "$here" "$here/_build/html" "$@"
echo "docs built: $here/_build/html/index.html"
