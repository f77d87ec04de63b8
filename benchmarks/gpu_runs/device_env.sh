# Sourced by a device run's script from the repository's root: the carried wheels installed (.whl), the
# environment every run there needs, $O (the device tool's $OUT), and run NAME LIMIT_S CMD... (its output in
# $O/NAME.txt, ending with its exit status and seconds).
O=${OUT:-/tmp/out}; mkdir -p "$O"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="$PWD:/tmp/site" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  timeout "$limit" "$@" > "$O/$name.txt" 2>&1; echo "[$name rc $? in $((SECONDS - t0)) s]" | tee -a "$O/$name.txt"; }
