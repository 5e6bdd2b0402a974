// Compares the conformance results of each backend, direct and via tether.
//   node compare.mjs [--label TEXT] OUT_DIR BACKEND...
// OUT_DIR/<backend>/direct and OUT_DIR/<backend>/via-tether are folders written
// by `conformance server -o DIR`: one sub-folder per scenario, named
// server-<scenario>-<timestamp>, holding a checks.json array of
// {id, name, status, errorMessage, details, ...}.
// A check is named <backend>:<scenario>/<id> (#n appended when an id repeats in
// a scenario) and passes when its status is SUCCESS.
// Writes OUT_DIR/passing-direct.txt, passing-via-tether.txt, checks-*.tsv; prints
// per-scenario summaries and the difference; exits 1 if the passing sets differ,
// 2 if a run produced no usable results, 0 otherwise. Its last line is
//   conformance (TEXT): N passed direct, M passed via tether, identical
// (without " (TEXT)" when no label is given).
import fs from "node:fs";
import path from "node:path";

const args = process.argv.slice(2);
let label = "";
if (args[0] === "--label") {
  label = args[1] ?? "";
  args.splice(0, 2);
}
const [outDir, ...backends] = args;
if (!backends.length) {
  console.error("usage: node compare.mjs [--label TEXT] OUT_DIR BACKEND...");
  process.exit(2);
}
// The verdict lines name the suite, so the two eras' verdicts can be told apart.
const verdict = label ? `conformance (${label})` : "conformance";

const RUNS = [
  { key: "direct", label: "direct" },
  { key: "via-tether", label: "via tether" },
];
const DIR_RE = /^server-(.+)-\d{4}-\d{2}-\d{2}T[\d-]+Z$/;

// -> { scenarios: Map(scenario -> [{name, check}]), broken: [] }
function load(dir, backend) {
  const scenarios = new Map();
  const broken = [];
  for (const entry of fs.existsSync(dir) ? fs.readdirSync(dir).sort() : []) {
    const m = DIR_RE.exec(entry);
    if (!m) continue;
    const scenario = m[1];
    const list = [];
    scenarios.set(scenario, list);
    let checks;
    try {
      checks = JSON.parse(fs.readFileSync(path.join(dir, entry, "checks.json"), "utf8"));
      if (!Array.isArray(checks)) throw new Error("checks.json is not an array");
    } catch (e) {
      broken.push(`${backend}:${scenario}: ${e.message}`);
      continue;
    }
    const seen = new Map();
    for (const c of checks) {
      const base = `${backend}:${scenario}/${c.id ?? c.name ?? "?"}`;
      const n = (seen.get(base) ?? 0) + 1;
      seen.set(base, n);
      list.push({ name: n === 1 ? base : `${base}#${n}`, check: c });
    }
  }
  return { scenarios, broken };
}

function show(c) {
  if (!c) return "      (no such check in this run)";
  const lines = [`      status: ${c.status}`];
  if (c.errorMessage) lines.push(`      error:  ${String(c.errorMessage).trim()}`);
  if (c.description) lines.push(`      about:  ${c.description}`);
  if (c.details !== undefined) {
    let d = JSON.stringify(c.details);
    if (d.length > 1500) d = d.slice(0, 1500) + " …";
    lines.push(`      details: ${d}`);
  }
  return lines.join("\n");
}

const all = { direct: new Map(), "via-tether": new Map() }; // name -> check
const tally = (list) => {
  const t = { SUCCESS: 0, FAILURE: 0, WARNING: 0 };
  for (const { check } of list) t[check.status] = (t[check.status] ?? 0) + 1;
  return t;
};
let unusable = false;

for (const backend of backends) {
  const res = {};
  for (const r of RUNS) {
    res[r.key] = load(path.join(outDir, backend, r.key), backend);
    for (const list of res[r.key].scenarios.values()) for (const { name, check } of list) all[r.key].set(name, check);
    if (res[r.key].scenarios.size === 0) unusable = true;
  }
  const names = [...new Set([...res.direct.scenarios.keys(), ...res["via-tether"].scenarios.keys()])];
  const width = Math.max(...names.map((s) => s.length), 8);
  console.log(`\n== ${backend}: passed/failed(/warnings) per scenario`);
  console.log(`   ${"scenario".padEnd(width)}  ${"direct".padEnd(9)}  via tether`);
  const totals = {};
  for (const s of names) {
    const cells = RUNS.map((r) => {
      const list = res[r.key].scenarios.get(s);
      if (!list) return "-";
      const t = tally(list);
      return `${t.SUCCESS}/${t.FAILURE}${t.WARNING ? "/" + t.WARNING : ""}`;
    });
    const mark = cells[0] === cells[1] ? " " : "≠";
    console.log(` ${mark} ${s.padEnd(width)}  ${cells[0].padEnd(9)}  ${cells[1]}`);
  }
  for (const [r, o] of [RUNS, [...RUNS].reverse()]) {
    const missing = [...res[o.key].scenarios.keys()].filter((s) => !res[r.key].scenarios.has(s));
    if (missing.length) console.log(`   no result ${r.label} (run timed out or crashed?): ${missing.join(", ")}`);
  }
  for (const r of RUNS) {
    const t = tally([...res[r.key].scenarios.values()].flat());
    totals[r.key] = t;
    console.log(
      `   ${r.label}: ${res[r.key].scenarios.size} scenarios, ${t.SUCCESS} passed, ${t.FAILURE} failed, ${t.WARNING} warnings`,
    );
    for (const b of res[r.key].broken) console.log(`   unreadable result (${r.label}): ${b}`);
  }
}

const passing = {};
for (const r of RUNS) {
  passing[r.key] = [...all[r.key]].filter(([, c]) => c.status === "SUCCESS").map(([k]) => k).sort();
  fs.writeFileSync(path.join(outDir, `passing-${r.key}.txt`), passing[r.key].map((k) => k + "\n").join(""));
  fs.writeFileSync(
    path.join(outDir, `checks-${r.key}.tsv`),
    [...all[r.key]].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)).map(([k, c]) => `${k}\t${c.status}\n`).join(""),
  );
}
const [A, B] = RUNS;
const setA = new Set(passing[A.key]);
const setB = new Set(passing[B.key]);
const onlyA = passing[A.key].filter((k) => !setB.has(k));
const onlyB = passing[B.key].filter((k) => !setA.has(k));
const same = onlyA.length === 0 && onlyB.length === 0;

if (same) {
  console.log(`\npassing checks, identical in both runs (${passing[A.key].length}; list in ${outDir}/passing-direct.txt)`);
} else {
  console.log(`\nPASSING CHECKS DIFFER`);
  for (const [only, here, there] of [[onlyA, A, B], [onlyB, B, A]]) {
    if (!only.length) continue;
    console.log(`\n  ${only.length} pass ${here.label} but not ${there.label}:`);
    for (const k of only) {
      const c = all[there.key].get(k);
      console.log(`  ✗ ${k}`);
      console.log(c ? `    ${there.label}:\n${show(c)}` : `    ${there.label}: no such check (its scenario has no result or did not get that far)`);
    }
  }
}

// Not part of the verdict: checks that do not pass in either run, with another status.
const notes = [];
for (const [k, c] of all[A.key]) {
  const d = all[B.key].get(k);
  if (c.status !== "SUCCESS" && d && d.status !== "SUCCESS" && d.status !== c.status) {
    notes.push(`  ~ ${k}: ${c.status} ${A.label}, ${d.status} ${B.label}`);
  }
}
if (notes.length) console.log(`\nnote: non-passing checks whose status differs (not counted):\n${notes.join("\n")}`);

if (unusable) {
  console.log(`\n${verdict}: no usable results from some run (logs in ${outDir})`);
  process.exit(2);
}
for (const b of backends) {
  if (!passing[A.key].some((k) => k.startsWith(`${b}:`))) {
    console.log(`\n${verdict}: nothing passed directly against ${b}: the reference run is broken`);
    process.exit(2);
  }
}
console.log(
  `\n${verdict}: ${passing[A.key].length} passed ${A.label}, ${passing[B.key].length} passed ${B.label}, ` +
    (same ? "identical" : `DIFFERENT (${onlyA.length} only ${A.label}, ${onlyB.length} only ${B.label})`),
);
process.exit(same ? 0 : 1);
