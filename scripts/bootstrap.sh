# Sourced by scripts/run and scripts/test: creates ./.venv once and installs the project into it.
# Usage: bootstrap_venv EXTRAS   (e.g. "train" or "train,dev")
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${ANATOMY_TOP_VENV:-$ROOT/.venv}"

bootstrap_venv() {
    local extras="$1"
    local py="${PYTHON:-}"
    if [ -z "$py" ]; then
        for cand in python3.11 python3.12 python3; do
            if command -v "$cand" >/dev/null 2>&1; then py="$cand"; break; fi
        done
    fi
    if [ ! -x "$VENV/bin/python" ]; then
        echo "creating $VENV with $py" >&2
        "$py" -m venv "$VENV"
    fi
    local stamp="$VENV/.installed-$extras"
    # Reinstall only when the project's metadata changed: keeps a second run fast.
    if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ]; then
        # torch is pinned so a CPU-only machine takes the local CPU wheel instead of a multi-GB CUDA build.
        # compat mode puts the checkout on sys.path instead of an import-hook finder that every
        # interpreter start would load (measured: 34 ms -> 17 ms for `python -c pass`).
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
            --config-settings editable_mode=compat -e "$ROOT[$extras]" "torch==2.13.0"
        if [[ ",$extras," == *",dev,"* ]]; then
            # DeepSpeed ships only an sdist whose build imports torch: build it against the pinned torch.
            "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-build-isolation \
                "deepspeed==0.19.8" "torch==2.13.0"
        fi
        touch "$stamp"
    fi
}
