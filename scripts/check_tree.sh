#!/usr/bin/env bash
# check_tree.sh - the shape of the tree that README "How the code is laid out"
# promises, checked on every `make test` (make check-tree):
#
#   chain     the layer chain of the Makefile's head comment
#             (base -> quant -> ... -> cli, "a/b" = side by side) is the
#             README's, word for word, and names every folder of src/
#   includes  no file of src/<layer>/ (.c, .h, .cu; and no public header)
#             includes a header of a layer above its own, or of another layer
#             on its level: "zr/<x>.h" belongs to the layer whose
#             src/<layer>/*.c (or .cu) defines the functions it declares,
#             "../<layer>/..." to that layer. bench/*.c is part of the zr
#             program and stands where src/cli does (the top): it may include
#             any public header and "../src/<layer>/..." of any layer the chain
#             names, never of a folder it does not
#   sizes     no file of src/ (.c, .h, .cu) or bench/ (.c) over 700 lines, no
#             function over 80 (from the line at column 0 that starts its
#             definition to its closing "}" at column 0, in the clang-formatted
#             tree; a kernel by the name after its __launch_bounds__(...))
#   devices   callers never ask which device they run on (README, "Devices
#             behind tables"): outside src/base/ and the CUDA backend's own
#             files (the Makefile's CUDA_ONLY_SRC, and the files named *cuda*
#             or *gpu*), at most MAX_DEVICE_BRANCHES conditionals (if, while,
#             ?:) on the device (a kind, on_gpu, on_device, device_memory);
#             "#if ZR_CUDA" / "#if ZR_NCCL" only there and at the build's
#             registration point (src/model/gpt_engine.c's list of backends)
#
# A file still over a size limit while another change splits it is listed in
# scripts/check_tree.allow, one path a line with a "#" comment naming what will
# fix it; an entry that is no longer over a limit is an error too, so the list
# only ever shrinks. Prints one "ok" line, or every offending item and fails.
set -u
cd "$(dirname "$0")/.." || exit 1

MAX_FILE=700
MAX_FUNC=80
MAX_DEVICE_BRANCHES=5
ALLOW=scripts/check_tree.allow
problems=()
bad() { problems+=("$*"); }

# ---- the chain ------------------------------------------------------------------

chain_re='[a-z]+(/[a-z]+)*( -> [a-z]+(/[a-z]+)*)+'
mk_chain=$(grep -m1 -E "^#[[:space:]]+${chain_re}[[:space:]]*$" Makefile |
    sed -E 's/^#[[:space:]]+//; s/[[:space:]]+$//')
rd_chain=$(grep -m1 -E "^[[:space:]]+${chain_re}[[:space:]]*$" README.md |
    sed -E 's/^[[:space:]]+//; s/[[:space:]]+$//')
if [ -z "$mk_chain" ]; then
    echo "check-tree: FAILED: no layer chain (a -> b -> ...) in the Makefile's head comment"
    exit 1
fi
if [ "$mk_chain" != "$rd_chain" ]; then
    bad "README.md: layer chain '${rd_chain:-none}' differs from the Makefile's '$mk_chain'"
fi

declare -A level # layer -> position in the chain (layers side by side share one)
i=0
for step in ${mk_chain//->/ }; do
    for layer in ${step//\// }; do
        level[$layer]=$i
    done
    i=$((i + 1))
done
for d in src/*/; do
    d=${d%/}
    d=${d#src/}
    [ -n "${level[$d]+x}" ] || bad "src/$d: a folder the layer chain does not name"
done
for layer in "${!level[@]}"; do
    [ -d "src/$layer" ] || bad "Makefile: layer '$layer' of the chain has no folder src/$layer"
done

# ---- which layer owns each public header ------------------------------------------

# Declarations and definitions start at column 0; the function's name is the
# first "zr_...(" on that line (calls in bodies are indented, function-pointer
# typedefs start with "typedef", prototypes in .c files end with ";").
# shellcheck disable=SC2016 # an awk program: its $0 is awk's
first_line_names='
    /^[A-Za-z_]/ && !/^typedef/ && match($0, /zr_[a-z0-9_]+\(/) {
        if (DEFS && $0 ~ /;[[:space:]]*$/) next
        print TAG, substr($0, RSTART, RLENGTH - 1)
    }'
declare -A owner_of_fn # function -> layer that defines it
while read -r layer fn; do
    owner_of_fn[$fn]=$layer
done < <(for f in src/*/*.c src/*/*.cu; do
    l=${f#src/}
    awk -v TAG="${l%%/*}" -v DEFS=1 "$first_line_names" "$f"
done)

declare -A owner # header name (x for zr/x.h) -> layer
for h in include/zr/*.h; do
    x=$(basename "$h" .h)
    layers=$(awk -v TAG=- -v DEFS=0 "$first_line_names" "$h" | while read -r _ fn; do
        echo "${owner_of_fn[$fn]:-}"
    done | sort -u | grep -v '^$' | tr '\n' ' ')
    read -r -a found <<<"$layers"
    if [ ${#found[@]} -eq 1 ]; then
        owner[$x]=${found[0]}
    elif [ ${#found[@]} -eq 0 ]; then
        bad "$h: no function it declares is defined in src/, so no layer owns it"
    else
        bad "$h: its functions are defined in several layers ($layers), so no one layer owns it"
    fi
done

# ---- includes ---------------------------------------------------------------------

# check_includes FILE LAYER: every #include of FILE against LAYER's level
check_includes() {
    local f=$1 layer=$2 n inc target
    while IFS=: read -r n inc; do
        inc=${inc#*\"}
        inc=${inc%\"*}
        case $inc in
        zr/*.h)
            local x=${inc#zr/}
            x=${x%.h}
            if [ ! -f "include/zr/$x.h" ]; then
                bad "$f:$n: includes $inc, which is not in include/zr"
                continue
            fi
            target=${owner[$x]:-}
            ;;
        ../src/*/*) # bench/: a header of src/<layer>/
            target=${inc#../src/}
            target=${target%%/*}
            ;;
        ../*/*)
            target=${inc#../}
            target=${target%%/*}
            ;;
        *) continue ;; # a header of the file's own folder
        esac
        [ -n "$target" ] || continue # unowned: reported above
        if [ -z "${level[$target]+x}" ]; then
            bad "$f:$n: includes $inc of '$target', a layer the chain does not name"
        elif [ "${level[$target]}" -gt "${level[$layer]}" ]; then
            bad "$f:$n: $layer includes $inc of $target, a layer above it"
        elif [ "${level[$target]}" -eq "${level[$layer]}" ] && [ "$target" != "$layer" ]; then
            bad "$f:$n: $layer includes $inc of $target, a layer beside it"
        fi
    done < <(grep -n -E '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f")
}

for f in src/*/*.c src/*/*.h src/*/*.cu; do
    l=${f#src/}
    l=${l%%/*}
    [ -n "${level[$l]+x}" ] && check_includes "$f" "$l"
done
# bench/ is linked into the zr program with src/cli: it stands at the cli layer
for f in bench/*.c bench/*.h; do
    [ -f "$f" ] && check_includes "$f" cli
done
for h in include/zr/*.h; do
    x=$(basename "$h" .h)
    [ -n "${owner[$x]:-}" ] && [ -n "${level[${owner[$x]}]+x}" ] && check_includes "$h" "${owner[$x]}"
done

# ---- sizes ------------------------------------------------------------------------

declare -A allowed=() # path -> 1 while listed in the allow-list
declare -A allowed_used=()
if [ -f "$ALLOW" ]; then
    n=0
    while IFS= read -r line || [ -n "$line" ]; do
        n=$((n + 1))
        entry=${line%%#*}
        entry=${entry//[[:space:]]/}
        [ -n "$entry" ] || continue
        case $line in
        *'#'*[![:space:]]*) ;;
        *) bad "$ALLOW:$n: $entry needs a comment (# what will bring it under the limits)" ;;
        esac
        allowed[$entry]=1
    done <"$ALLOW"
fi

# over FILE WHAT: a size offence, unless FILE is allowed
over() {
    if [ -n "${allowed[$1]:-}" ]; then
        allowed_used[$1]=1
    else
        bad "$2"
    fi
}

# the CUDA kernels too (.cu), and bench/: the same limits as any source file
for f in src/*/*.c src/*/*.h src/*/*.cu bench/*.c bench/*.h; do
    [ -f "$f" ] || continue
    lines=$(wc -l <"$f")
    [ "$lines" -le $MAX_FILE ] || over "$f" "$f: $lines lines (at most $MAX_FILE)"
    while read -r at len name; do
        over "$f" "$f:$at: $name is $len lines (at most $MAX_FUNC)"
    done < <(awk -v MAX=$MAX_FUNC '
        /^[A-Za-z_]/ { start = NR; head = $0 }
        # a kernel: "__global__ void __launch_bounds__(N)" then its name on the next line
        /^[[:space:]]+[A-Za-z_][A-Za-z0-9_]*\(/ && start && !open && head ~ /__launch_bounds__/ {
            h = head
            sub(/__launch_bounds__\([^()]*\)/, "", h)
            if (h !~ /[A-Za-z_][A-Za-z0-9_]*\(/) head = $0
        }
        /^\{[[:space:]]*$/ && start { open = start; name = head }
        /^\}[[:space:]]*$/ && open {
            n = NR - open + 1
            if (n > MAX) {
                sub(/^__attribute__\(\(([^()]|\([^()]*\))*\)\)[[:space:]]*/, "", name)
                sub(/__launch_bounds__\([^()]*\)/, "", name)
                if (match(name, /[A-Za-z_][A-Za-z0-9_]*\(/)) name = substr(name, RSTART, RLENGTH - 1)
                print open, n, name
            }
            open = 0; start = 0
        }' "$f")
done

for entry in "${!allowed[@]}"; do
    [ -n "${allowed_used[$entry]:-}" ] ||
        bad "$ALLOW: $entry is within the limits (or gone): remove its entry"
done

# ---- devices ----------------------------------------------------------------------

cuda_only=" $(sed -n '/^CUDA_ONLY_SRC :=/,/[^\\]$/p' Makefile | sed 's/^CUDA_ONLY_SRC :=//; s/\\//g' |
    tr -s ' \n' '  ') "
device_re='\<(on_gpu|on_device|device_memory|ZR_DEVICE_CPU|ZR_DEVICE_CUDA)\>'
branch_re='(\<(if|while) \()|( \? )'
branches=()
for f in src/*/*.c; do
    case "$f" in src/base/* | *cuda* | *gpu*) continue ;; esac
    case "$cuda_only" in *" $f "*) continue ;; esac
    while IFS= read -r hit; do
        branches+=("$f:$hit")
    done < <(grep -nE "$branch_re" "$f" | grep -E "$device_re" | grep -vE '^[0-9]+:[[:space:]]*(/?\*)')
    if grep -nE '^[[:space:]]*#[[:space:]]*if(def)?[[:space:]].*\<ZR_(CUDA|NCCL)\>' "$f" >/dev/null &&
        [ "$f" != src/model/gpt_engine.c ]; then
        bad "$f: #if ZR_CUDA/ZR_NCCL outside src/base/, the CUDA backend's files and the registration point"
    fi
done
if [ ${#branches[@]} -gt $MAX_DEVICE_BRANCHES ]; then
    bad "${#branches[@]} conditionals on the device outside src/base/ and the CUDA backend's files (at most $MAX_DEVICE_BRANCHES): put the work behind the device's table"
    for b in "${branches[@]}"; do bad "  $b"; done
fi

# ---- verdict ----------------------------------------------------------------------

if [ ${#problems[@]} -eq 0 ]; then
    echo "check-tree: ok ($mk_chain; ${#allowed[@]} file(s) allowed over the size limits in $ALLOW;" \
        "${#branches[@]} of at most $MAX_DEVICE_BRANCHES conditionals on the device outside the device layers)"
    exit 0
fi
echo "check-tree: FAILED (${#problems[@]}):"
printf '  %s\n' "${problems[@]}"
exit 1
