# Sourced by the scripts that build JavaScript plugins. `make_js_toolchain DIR` installs the pinned
# toolchain of sdk/js/toolchain (componentize-js, esbuild) into DIR with `npm ci`, or reuses it
# while the lock file is unchanged; `opentinker plugin build` uses it when OPENTINKER_JS_TOOLCHAIN
# names DIR.
make_js_toolchain() {
    local dir="$1"
    local stamp="$dir/package-lock.sha256"
    if ! (cd sdk/js/toolchain && sha256sum --status -c "$stamp" 2>/dev/null); then
        mkdir -p "$dir"
        cp sdk/js/toolchain/package.json sdk/js/toolchain/package-lock.json "$dir/"
        (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
        (cd sdk/js/toolchain && sha256sum package-lock.json) > "$stamp"
    fi
}
