# Sourced by scripts/device_benchmark.sh and scripts/device_answers.sh: installs the wheels that
# travelled in .wheels/ or .whl/ (the device README) into a temporary folder, never the system,
# when the machine lacks one of the given modules, and puts that folder first on PYTHONPATH.
#
#   install_wheels SITE MODULE[,MODULE...]
install_wheels() {
  local site=$1 modules=$2 dir
  for dir in .wheels .whl; do
    if compgen -G "$dir/*.whl" >/dev/null && ! python3 -c "import $modules" 2>/dev/null; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$site" "$dir"/*.whl
    fi
  done
  export PYTHONPATH="$site:${PYTHONPATH:-}"
  # Checked: a wheel for another Python, or one that was not carried, fails here in one line
  # rather than minutes later inside the first script that imports it.
  if ! python3 -c "import $modules" 2>/dev/null; then
    echo "install_wheels: cannot import $modules with $(python3 -V 2>&1) after installing" \
      "$(compgen -G '.wh*/*.whl' | tr '\n' ' ')into $site; carry .whl (made by:" \
      "bash scripts/device_answers.sh pack, for this machine's Python)" >&2
    return 1
  fi
}
