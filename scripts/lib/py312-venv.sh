# Sourced by scripts/setup-jax.sh and scripts/setup-tf.sh (not run alone).
#
# py312_venv VENV WHAT: makes VENV a working Python 3.12 venv (pyenv's 3.12.1
# first, then python3.12 on PATH), repairing a broken or wrong-version one.
# WHAT names what needs it, for the error message. Uses the caller's `log`.
py312_venv() {
    local venv="$1" what="$2"
    local py=()
    if command -v pyenv >/dev/null 2>&1 && PYENV_VERSION=3.12.1 pyenv exec python -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1; then
        py=(env PYENV_VERSION=3.12.1 pyenv exec python)
    elif command -v python3.12 >/dev/null 2>&1 && python3.12 -c 'import venv' >/dev/null 2>&1; then
        py=(python3.12)
    else
        log "ERROR: $what need(s) Python 3.12, but neither pyenv's 3.12.1" \
            "(PYENV_VERSION=3.12.1 pyenv exec python) nor python3.12 (with the venv module) was found." \
            "Install one, e.g. 'pyenv install 3.12.1' or 'apt-get install python3.12 python3.12-venv'."
        return 1
    fi
    if [[ -e "$venv" && ! -x "$venv/bin/python" ]]; then
        log "removing broken venv at $venv"
        rm -rf "$venv"
    fi
    if [[ -x "$venv/bin/python" ]] && ! "$venv/bin/python" -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1; then
        log "venv at $venv is not Python 3.12; recreating"
        rm -rf "$venv"
    fi
    if [[ ! -x "$venv/bin/python" ]]; then
        log "creating venv at $venv with $("${py[@]}" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
        mkdir -p "$(dirname "$venv")"
        "${py[@]}" -m venv "$venv"
    fi
}
