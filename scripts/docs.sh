#!/usr/bin/env bash
# The documentation site (mkdocs.yml, docs/), built with every warning an error (a broken
# link or cross-reference, a docstring mkdocstrings cannot render) into ./site. Installs
# cairn and the docs extra (mkdocs-material, mkdocstrings) into .venv on first use.
CAIRN_VENV=runtime
CAIRN_NEED_DOCS=1
source "$(dirname "$0")/_venv.sh"
export NO_MKDOCS_2_WARNING=1  # Material's banner about MkDocs 2.0, printed on every build
mkdocs build --strict "$@"
