#!/usr/bin/env bash
# Checks the coordstore monitoring mixin (deploy/monitoring/):
#   1. promtool check rules on alerts.yaml and recording.yaml;
#   2. promtool test rules on tests/*.yaml, and that every alert has a test
#      where it fires and one where it must not, and every recording rule a
#      test;
#   3. every expression of dashboard.json (panel targets and the variables'
#      label_values selectors), with Grafana's variables replaced by valid
#      values, through promtool check rules as one recording rule each;
#      every coordstore:* name it uses recorded in recording.yaml;
#   4. every coordstore_* metric name in the rules and the dashboard listed
#      in metrics.txt (the names the nodes export).
# Needs promtool (Debian: prometheus; or set PROMTOOL) and python3.
# Prints one line; on failure, what failed and why, and exits non-zero.
set -euo pipefail
cd "$(dirname "$0")"

PROMTOOL=${PROMTOOL:-promtool}
if ! command -v "$PROMTOOL" >/dev/null 2>&1; then
    echo "check.sh: FAILED: $PROMTOOL not found (install prometheus, or set PROMTOOL)" >&2
    exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# run WHAT CMD...: quiet on success; on failure the output and a verdict.
run() {
    local what=$1
    shift
    if ! "$@" >"$tmp/out" 2>&1; then
        cat "$tmp/out" >&2
        echo "check.sh: FAILED: $what" >&2
        exit 1
    fi
}

run "promtool check rules alerts.yaml recording.yaml" \
    "$PROMTOOL" check rules alerts.yaml recording.yaml
run "promtool test rules tests/*.yaml" \
    "$PROMTOOL" test rules tests/*.yaml

# Writes $tmp/dashboard-rules.yaml (JSON is YAML) and $tmp/summary.
run "dashboard, tests and metric names" python3 - "$tmp" <<'PY'
import json, re, sys

tmp = sys.argv[1]
errors = []

def text(path):
    with open(path) as f:
        return f.read()

alerts_src, recording_src = text("alerts.yaml"), text("recording.yaml")
alerts = re.findall(r"^\s*- alert:\s*(\S+)", alerts_src, re.M)
records = sorted(set(re.findall(r"^\s*- record:\s*(\S+)", recording_src, re.M)))

# Tests: each alert once firing and once with exp_alerts: [].
fires, silent = set(), set()
tested_exprs = ""
import glob
for path in sorted(glob.glob("tests/*.yaml")):
    lines = text(path).splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"\s*alertname:\s*(\S+)", line)
        if m:
            rest = [l for l in lines[i + 1:] if l.strip() and not l.strip().startswith("#")]
            (silent if rest and re.match(r"\s*exp_alerts:\s*\[\]", rest[0]) else fires).add(m.group(1))
        m = re.match(r"\s*-?\s*expr:\s*(.*)", line)
        if m:
            tested_exprs += m.group(1) + "\n"
for a in alerts:
    if a not in fires:
        errors.append(f"alert {a}: no test where it fires")
    if a not in silent:
        errors.append(f"alert {a}: no test where it must not fire (exp_alerts: [])")
for r in records:
    if not re.search(re.escape(r) + r"(?![\w:])", tested_exprs):
        errors.append(f"recording rule {r}: no promql_expr_test uses it")

# The dashboard.
dash = json.loads(text("dashboard.json"))
VALUES = {
    "__rate_interval": "5m", "__interval": "1m", "__range": "1h",
    "__range_s": "3600", "__range_ms": "3600000", "__interval_ms": "60000",
    "__interval_s": "60", "job": "coordstore", "namespace": "default",
    "datasource": "prometheus",
}
VAR = re.compile(r"\$\{(\w+)(?::[\w]+)?\}|\$(\w+)|\[\[(\w+)\]\]")

def substitute(expr, where):
    def one(m):
        name = m.group(1) or m.group(2) or m.group(3)
        if name not in VALUES:
            errors.append(f"{where}: unknown Grafana variable ${name} in {expr!r}")
            return "x"
        return VALUES[name]
    return VAR.sub(one, expr)

if dash.get("schemaVersion", 0) < 36:
    errors.append(f"dashboard: schemaVersion {dash.get('schemaVersion')} is older than 36")
variables = {v.get("name"): v for v in dash.get("templating", {}).get("list", [])}
if variables.get("datasource", {}).get("type") != "datasource":
    errors.append("dashboard: no datasource variable named datasource")
if "namespace" not in variables:
    errors.append("dashboard: no namespace variable")

exprs = []  # (record name, where, expr)
for name, v in variables.items():
    q = v.get("query")
    q = q.get("query", "") if isinstance(q, dict) else (q or "")
    m = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", q)
    if v.get("type") == "query" and m:
        exprs.append((f"dashboard:variable_{name}", f"variable {name}", m.group(1)))
    if v.get("type") == "query" and v.get("datasource", {}).get("uid") != "${datasource}":
        errors.append(f"variable {name}: datasource is not ${{datasource}}")

def walk(panels):
    for p in panels:
        yield p
        yield from walk(p.get("panels", []))

ids = set()
rows = 0
for p in walk(dash.get("panels", [])):
    pid = p.get("id")
    if pid in ids:
        errors.append(f"panel {pid}: duplicate id")
    ids.add(pid)
    g = p.get("gridPos", {})
    if g.get("x", 0) + g.get("w", 0) > 24:
        errors.append(f"panel {pid} ({p.get('title')}): wider than the grid")
    if p.get("type") == "row":
        rows += 1
        continue
    where = f"panel {pid} ({p.get('title')})"
    if p.get("datasource", {}).get("uid") != "${datasource}":
        errors.append(f"{where}: datasource is not ${{datasource}}")
    targets = p.get("targets", [])
    if not targets:
        errors.append(f"{where}: no targets")
    for t in targets:
        ref = t.get("refId", "?")
        if not t.get("expr", "").strip():
            errors.append(f"{where} target {ref}: no expr")
            continue
        if t.get("datasource", {}).get("uid") != "${datasource}":
            errors.append(f"{where} target {ref}: datasource is not ${{datasource}}")
        exprs.append((f"dashboard:panel_{pid}_{ref}", f"{where} target {ref}", t["expr"]))

rules = []
for record, where, expr in exprs:
    rules.append({"record": record, "expr": substitute(expr, where)})
    for name in re.findall(r"coordstore:[\w:]+", expr):
        if name not in records:
            errors.append(f"{where}: {name} is not recorded in recording.yaml")
with open(f"{tmp}/dashboard-rules.yaml", "w") as f:
    json.dump({"groups": [{"name": "dashboard", "rules": rules}]}, f, indent=1)

# Metric names: every coordstore_* name must be one the nodes export.
known = {}
for line in text("metrics.txt").splitlines():
    if line.strip() and not line.startswith("#"):
        name, kind = line.split()[:2]
        known[name] = kind
def exported(name):
    if name in known:
        return True
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and known.get(name[: -len(suffix)]) == "histogram":
            return True
    return False
sources = {"alerts.yaml": alerts_src, "recording.yaml": recording_src,
           "dashboard.json": "\n".join(e for _, _, e in exprs)}
for path in sorted(glob.glob("tests/*.yaml")):
    sources[path] = text(path)
for path, src in sources.items():
    for name in sorted(set(re.findall(r"\bcoordstore_\w+", src))):
        if not exported(name):
            errors.append(f"{path}: {name} is not in metrics.txt")

if errors:
    print("\n".join(errors))
    sys.exit(1)
with open(f"{tmp}/summary", "w") as f:
    f.write(f"{len(alerts)} alerts, {len(records)} recorded names, "
            f"{rows} dashboard rows, {len(exprs)} dashboard expressions")
PY

run "promtool check rules on the dashboard's expressions" \
    "$PROMTOOL" check rules "$tmp/dashboard-rules.yaml"

echo "check.sh: OK: rules valid, tests pass, $(cat "$tmp/summary") valid, metric names known"
