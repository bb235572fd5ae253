#!/usr/bin/env bash
# Static figures of the GPU kernels, without a GPU. For each architecture, the kernels are
# compiled with NVRTC exactly as the library compiles them (`stragglar kernels --resources`),
# and the report reads:
#   - compile: seconds NVRTC took (a job's first use on a host pays it, unless cached);
#   - AllReduce regs / stack / spill st: ptxas's figures for ncclStragglarAllReduce;
#   - control spill st: spill stores of the kernel's own code, its outlined control functions
#     included (the step and copy-in: once per step; the arrival work, graph decisions and
#     failure path: once per call at most), per thread, summed;
#   - data-loop spills: the largest spill (stores + loads, bytes) of the outlined element-wise
#     functions (sg_apply<lane, op>, sg_copy_elems); "inlined" when the build inlines them;
#   - sys fences: MEMBAR.*.SYS instructions in the whole CUBIN's SASS (nvdisasm);
#   - loads before FADD: the longest run of 16-byte global loads (LDG.E.128) issued before a
#     float add uses one, with no store between (a store ends a loop body) and within one
#     function, over the whole SASS: how many loads a reduce keeps in flight;
#   - hw cvt: F2FP instructions (hardware f32 -> fp16/bf16 conversions; 0 means software);
#   - in flight at a store (apply / copy): how many 16-byte loads a data loop has issued and
#     not yet used when it stores (read in address order: a load is in flight until a later
#     instruction names one of its registers), the most over each function's stores, the
#     least of that over the combines (sg_apply) / over the copies (sg_copy_elems); a loop
#     that issues its next pass's loads before storing this one's shows them here.
# A second table counts, per architecture, the SASS instructions of the step function
# (sg_step, outlined: one call per step of a plan) over all its branches, not along one path:
# all of them, block barriers (BAR.SYNC), global loads (LDG) and stores (STG), local-memory
# loads (LDL: the call state passed by address), calls (CALL: the outlined data loops, one per
# type and op), branches (BRA) and system-scope fences (MEMBAR .SYS).
# With --before REV, the sources of git revision REV are compiled too (`--source`), for a
# before/after table.
#
# usage: scripts/kernel-figures.sh [--before REV] [--arch LIST]
#   needs target/release/stragglar (cargo build --release), libnvrtc (LD_LIBRARY_PATH or the
#   pip wheel), and nvdisasm (NVDISASM, or the one in .venv's triton wheel)
set -euo pipefail
cd "$(dirname "$0")/.."
BEFORE=""
ARCHS="sm_80,sm_90"
while [ $# -gt 0 ]; do
  case "$1" in
    --before) BEFORE="$2"; shift 2 ;;
    --arch) ARCHS="$2"; shift 2 ;;
    *) echo "usage: scripts/kernel-figures.sh [--before REV] [--arch LIST]" >&2; exit 2 ;;
  esac
done
CLI=target/release/stragglar
if [ ! -x "$CLI" ]; then
  echo "kernel-figures: build the CLI first (cargo build --release)" >&2
  exit 1
fi
NVDISASM="${NVDISASM:-$(find .venv -name nvdisasm -type f 2>/dev/null | head -1)}"
if [ -z "$NVDISASM" ] || [ ! -x "$NVDISASM" ]; then
  echo "kernel-figures: nvdisasm not found (set NVDISASM)" >&2
  exit 1
fi
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
# "LABEL|ARCH|DIR" of every build compiled, for the step table.
BUILT=()

# figures LABEL [SOURCE_DIR]: one table row per architecture.
figures() {
  local label="$1" source=("${@:2}") arch
  for arch in ${ARCHS//,/ }; do
    local out="$WORK/$label-$arch"
    mkdir -p "$out"
    local args=(kernels --arch "$arch" --resources --out "$out")
    [ ${#source[@]} -gt 0 ] && args+=(--source "${source[0]}")
    "$CLI" "${args[@]}" > "$out/report.txt" 2>&1 || {
      cat "$out/report.txt" >&2
      exit 1
    }
    "$NVDISASM" "$out/stragglar_$arch.cubin" > "$out/sass.txt" 2>/dev/null
    BUILT+=("$label|$arch|$out")
    awk -v label="$label" -v arch="$arch" -v sass="$out/sass.txt" '
      /ncclStragglarAllReduce in [0-9.]+ s with NVRTC/ { for (i = 1; i < NF; i++) if ($(i + 1) == "s" && $(i - 1) == "in") secs = $i }
      /Function properties for/ { fn = $NF }
      /bytes stack frame/ {
        gsub(",", "")
        for (i = 1; i <= NF; i++) {
          if ($(i + 1) == "bytes" && $(i + 2) == "stack") stack[fn] = $i
          if ($(i + 1) == "bytes" && $(i + 3) == "stores") st[fn] = $i
          if ($(i + 1) == "bytes" && $(i + 3) == "loads") ld[fn] = $i
        }
        if (fn ~ /sg_apply|sg_copy_elems/) {
          data = 1
          if (st[fn] + ld[fn] > worst) worst = st[fn] + ld[fn]
        } else if (fn == "ncclStragglarAllReduce" || fn !~ /^nccl/) {
          control += st[fn]
        }
      }
      /Used [0-9]+ registers/ && fn == "ncclStragglarAllReduce" {
        for (i = 1; i <= NF; i++) if ($(i + 1) == "registers,") regs = $i
      }
      # The registers an operand text names into names[] (R12.64: R12 and R13); returns the count.
      function named(text,   n, r) {
        n = 0
        delete names
        while (match(text, /(^|[^A-Za-z0-9])R[0-9]+(\.64)?/)) {
          r = substr(text, RSTART, RLENGTH)
          sub(/^[^R]*R/, "", r)
          names[++n] = int(r)
          if (r ~ /\.64$/) names[++n] = int(r) + 1
          text = substr(text, RSTART + RLENGTH)
        }
        return n
      }
      # The loads in flight at each store of function `fn` (loads[]: first register of each).
      function flush_function() {
        if (fn_kind == "apply" && (apply_least == "" || fn_most < apply_least)) apply_least = fn_most
        if (fn_kind == "copy" && (copy_least == "" || fn_most < copy_least)) copy_least = fn_most
        fn_kind = ""; fn_most = 0; pending = 0
      }
      END {
        while ((getline line < sass) > 0) {
          if (line ~ /MEMBAR[.A-Z]*\.SYS/) fences++
          if (line ~ /F2FP/) cvt++
          if (line ~ /^[$_A-Za-z].*:$/ || line ~ /STG/) run = 0
          if (line ~ /LDG\.E\.128/) run++
          if (line ~ /[^A-Z]FADD[ .]/) { if (run > best) best = run; run = 0 }
          if (line ~ /^[$_A-Za-z].*:$/) {
            flush_function()
            if (line ~ /sg_apply/) fn_kind = "apply"
            if (line ~ /sg_copy_elems/) fn_kind = "copy"
            continue
          }
          if (fn_kind == "" || line !~ /\*\/ /) continue
          code = line
          sub(/^[ \t]*\/\*[0-9a-f]*\*\/[ \t]*/, "", code)
          sub(/^@!?U?P[A-Z0-9]+[ \t]+/, "", code)
          sub(/[ \t]*;.*$/, "", code)
          op = code; sub(/[ \t].*$/, "", op)
          args = code; if (!sub(/^[^ \t]+[ \t]+/, "", args)) args = ""
          if (op ~ /^STG/ && pending > fn_most) fn_most = pending
          written = ""
          if (op ~ /^LDG\.E\.128/) { written = args; sub(/,.*$/, "", written); sub(/^[^,]*,/, "", args) }
          n = named(args)
          kept = 0
          for (i = 1; i <= pending; i++) {
            hit = 0
            for (j = 1; j <= n; j++) if (names[j] >= loads[i] && names[j] < loads[i] + 4) hit = 1
            if (!hit) loads[++kept] = loads[i]
          }
          pending = kept
          if (written != "" && named(written) > 0) loads[++pending] = names[1]
        }
        flush_function()
        printf "| %s | %s | %s s | %s / %s B / %s B | %d B | %s | %d | %d | %d | %s / %s |\n", label, arch,
          secs, regs, stack["ncclStragglarAllReduce"], st["ncclStragglarAllReduce"], control,
          data ? worst + 0 " B" : "inlined", fences, best, cvt, apply_least, copy_least
      }' "$out/report.txt"
  done
}

echo "| build | arch | compile | AllReduce regs / stack / spill st | control spill st | data-loop spills | sys fences | loads before FADD | hw cvt | in flight at a store (apply / copy) |"
echo "|---|---|---|---|---|---|---|---|---|---|"
if [ -n "$BEFORE" ]; then
  mkdir -p "$WORK/before-src"
  git archive "$BEFORE" cuda | tar -x -C "$WORK/before-src"
  figures "before ($(git rev-parse --short "$BEFORE"))" "$WORK/before-src/cuda"
fi
figures "now ($(git rev-parse --short HEAD)$(git diff --quiet HEAD -- cuda || echo '+'))"

echo
echo "| build | arch | sg_step instructions | BAR.SYNC | LDG | STG | LDL | CALL | BRA | MEMBAR .SYS |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for built in "${BUILT[@]}"; do
  IFS='|' read -r label arch out <<< "$built"
  awk -v label="$label" -v arch="$arch" '
    # The step function begins at its label; the next function label ends it.
    /^\$?[A-Za-z_$][^ ]*sg_stepE[^ ]*:$/ { on = 1; next }
    on && /^[$_A-Za-z.][^ ]*:$/ && !/^\.L/ { on = 0 }
    on && /\/\*[0-9a-f]+\*\// {
      op = $2
      if (op ~ /^@/) op = $3
      n++
      if (op ~ /^BAR\.SYNC/) bar++
      if (op ~ /^LDG/) ldg++
      if (op ~ /^STG/) stg++
      if (op ~ /^LDL/) ldl++
      if (op ~ /^CALL/) call++
      if (op ~ /^BRA/) bra++
      if (op ~ /^MEMBAR.*\.SYS/) fence++
    }
    END {
      printf "| %s | %s | %d | %d | %d | %d | %d | %d | %d | %d |\n", label, arch, n, bar, ldg,
        stg, ldl, call, bra, fence
    }' "$out/sass.txt"
done
