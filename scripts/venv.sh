# Sourced by the scripts that need Python packages. `make_venv DIR REQUIREMENTS [NO_DEPS]` makes
# the virtual environment DIR from the pinned REQUIREMENTS file (a path from the repository root,
# where the scripts run), then the packages of NO_DEPS without their dependencies (for a package
# whose declared requirements the registry cannot meet, installed with what it really needs), or
# reuses it while those files are unchanged.
make_venv() {
    local venv="$1" requirements="$2" no_deps="${3:-}"
    local stamp="$venv/requirements.sha256"
    if ! sha256sum --status -c "$stamp" 2>/dev/null; then
        python3 -m venv "$venv"
        "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$requirements"
        if [[ -n "$no_deps" ]]; then
            "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps -r "$no_deps"
        fi
        sha256sum "$requirements" $no_deps > "$stamp"
    fi
}
