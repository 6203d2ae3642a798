#!/usr/bin/env bash
# Compiling loadstar's headers as C++17 stops at once with one error that names the standard
# needed, not hundreds. Usage: check_cxx17.sh INCLUDE_DIR COMPILER [ARGS...]
set -uo pipefail
include=$1
shift
source=$(mktemp --suffix=.cpp)
trap 'rm -f "$source"' EXIT
status=0
for header in loadstar/loadstar.hpp loadstar/data.hpp loadstar/keras.hpp loadstar/tensor.hpp \
  loadstar/keras/model.hpp loadstar/data/sequence_adapter.hpp; do
  printf '#include <%s>\nint main() { return 0; }\n' "$header" >"$source"
  output=$("$@" -std=c++17 -I"$include" -fsyntax-only "$source" 2>&1)
  errors=$(grep -c 'error:' <<<"$output")
  if ! grep -q 'loadstar requires C++20: compile with -std=c++20' <<<"$output" || ((errors > 2)); then
    echo "FAIL: <$header> as C++17 gave $errors error lines, expected the C++20 message alone:"
    head -20 <<<"$output"
    status=1
  else
    echo "ok: <$header> as C++17 stops with: $(grep -m1 'requires C++20' <<<"$output")"
  fi
done
exit $status
