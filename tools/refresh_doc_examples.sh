#!/usr/bin/env bash
set -e
# Re-run the commands whose output docs/cli.md, docs/adding-a-backend.md and docs/verification.md
# quote, and regenerate docs/backends.md, the compat rules and docs/vllm-0.33-fixes.md. Needs .venv.
cd "$(dirname "$0")/.."
export T="$(mktemp -d)"; trap 'rm -rf "$T"' EXIT
export PYTHONPATH=examples/b12x-pack NO_COLOR=1
B=.venv/bin
$B/dsv4sel check --rules examples/b12x-pack/dsv4sel_b12x/rules --allow-impl-module dsv4sel_b12x > $T/a1.txt || true
$B/dsv4sel diff --pack --allow-impl-module dsv4sel_b12x - examples/b12x-pack/dsv4sel_b12x/rules > $T/a2.txt || true
$B/dsv4sel explain --platform cuda --capability 12.1 --rules examples/b12x-pack/dsv4sel_b12x/rules --allow-impl-module dsv4sel_b12x > $T/e1.txt || true
$B/dsv4sel explain --platform cuda --capability 9.0 --backend B12X_MLA_SPARSE --kv-cache-dtype fp8 --rules examples/b12x-pack/dsv4sel_b12x/rules --allow-impl-module dsv4sel_b12x > $T/e2.txt || true
unset PYTHONPATH
$B/dsv4sel explain --platform cuda --capability 10.0 --kv-cache-dtype bfloat16 > $T/e3.txt || true
$B/dsv4sel check > $T/check.txt
$B/python - <<'PY'
import os
T = os.environ['T']
def block(s, cmd, new):
    start = s.index(cmd) + len(cmd); end = s.index("```", start)
    return s[:start] + new + s[end:]
p = 'docs/adding-a-backend.md'; s = open(p).read()
chk = open(T + '/a1.txt').read().splitlines()
new = "\n".join([chk[0], "", chk[2], chk[3], "", "  ...", *[l for l in chk if l.startswith("  B12X_MLA_SPARSE ")], "  ...",
                 *[l for l in chk if l.startswith("  b12x-")], "", *[l for l in chk if l.startswith("clean:")]]) + "\n"
s = block(s, "$ dsv4sel check --rules examples/b12x-pack/dsv4sel_b12x/rules --allow-impl-module dsv4sel_b12x\n", new)
d = open(T + '/a2.txt').read().split("\n\n")
s = block(s, "$ dsv4sel diff --pack --allow-impl-module dsv4sel_b12x - examples/b12x-pack/dsv4sel_b12x/rules\n", "\n\n".join(d[:4]) + "\n\n...\n")
s = block(s, "$ dsv4sel explain --platform cuda --capability 12.1 --rules examples/b12x-pack/dsv4sel_b12x/rules --allow-impl-module dsv4sel_b12x\n", open(T + '/e1.txt').read())
s = block(s, "$ dsv4sel explain --platform cuda --capability 9.0 --backend B12X_MLA_SPARSE --kv-cache-dtype fp8 --rules ... --allow-impl-module dsv4sel_b12x\n", open(T + '/e2.txt').read())
open(p, 'w').write(s)
p = 'docs/cli.md'; s = open(p).read()
s = block(s, "$ dsv4sel explain --platform cuda --capability 10.0 --kv-cache-dtype bfloat16\n", open(T + '/e3.txt').read())
open(p, 'w').write(s)
p = 'docs/verification.md'; s = open(p).read()
chk = open(T + '/check.txt').read().splitlines()
n = next(i for i, l in enumerate(chk) if l.startswith("  rule "))
s = block(s, "as printed by `dsv4sel check`:\n\n```\n", "\n".join(chk[2:n - 1]) + "\n")
head = chk[0].split(": ", 1)[1]
import re
s = re.sub(r"The shipped rules \([^)]*\), as printed", f"The shipped rules ({head}), as printed", s)
open(p, 'w').write(s)
PY
$B/dsv4sel table --format md > docs/backends.md
$B/python tools/gen_compat_vllm033.py
$B/python tools/vllm_fix_cubes.py
