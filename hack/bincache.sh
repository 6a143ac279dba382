# shellcheck shell=sh
# POSIX sh: the Makefile's recipes run it under dash.
# A machine-wide cache of the Go binaries the build makes from pinned modules (sourced by nodes/build.sh and the
# Makefile's tool targets). A fresh clone (CI clones main afresh every run) otherwise relinks ~20 binaries from the
# warm Go build cache: about 2.5 minutes of every clean-clone `make test`. An entry is keyed by the binary's name,
# its pin, the Go toolchain and BINCACHE_INPUTS (what else the caller's build reads, e.g. a hash of its go.mod);
# storing a new entry for a name removes that name's older ones. KANRI_BIN_CACHE moves the cache; removing the
# folder only costs a rebuild.

bincache_dir="${KANRI_BIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kanri/bin}"

# bincache_name NAME: NAME as one file name (cni/bridge -> cni_bridge).
bincache_name() {
  printf '%s' "$1" | tr / _
}

# bincache_key NAME PIN: the cache file for NAME built at PIN with this toolchain and BINCACHE_INPUTS.
bincache_key() {
  local digest
  digest="$(printf '%s\n' "$2" "$(go env GOVERSION)" "${BINCACHE_INPUTS:-}" | sha256sum | cut -c1-24)"
  echo "$bincache_dir/$(bincache_name "$1")@$digest"
}

# bincache_fetch NAME PIN TARGET: copy a cached NAME@PIN to TARGET (atomically); fails when there is none.
bincache_fetch() {
  local key
  key="$(bincache_key "$1" "$2")"
  [ -x "$key" ] || return 1
  mkdir -p "$(dirname "$3")"
  cp "$key" "$3.tmp.$$" && mv "$3.tmp.$$" "$3"
  echo "reused $1 $2 (built before on this machine: $key)"
}

# bincache_store NAME PIN TARGET: keep TARGET as NAME@PIN, replacing NAME's older entries.
bincache_store() {
  local key
  key="$(bincache_key "$1" "$2")"
  mkdir -p "$bincache_dir"
  find "$bincache_dir" -maxdepth 1 -name "$(bincache_name "$1")@*" ! -name "$(basename "$key")" -delete
  cp "$3" "$key.tmp.$$" && mv "$key.tmp.$$" "$key"
}
