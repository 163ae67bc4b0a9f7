# Sourced by the scripts that need Python packages. `make_venv DIR REQUIREMENTS` makes the virtual
# environment DIR from the pinned REQUIREMENTS file (a path from the repository root, where the
# scripts run), or reuses it while that file is unchanged.
make_venv() {
    local venv="$1" requirements="$2"
    local stamp="$venv/requirements.sha256"
    if ! sha256sum --status -c "$stamp" 2>/dev/null; then
        python3 -m venv "$venv"
        "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$requirements"
        sha256sum "$requirements" > "$stamp"
    fi
}
