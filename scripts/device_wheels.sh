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
}
