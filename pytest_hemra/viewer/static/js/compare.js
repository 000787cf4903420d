// Compare: a harness in two runs, or two harnesses of one run, per task side by side, with the
// paired difference (b - a), its interval and p-value.
import { api, clear, estimate, failure, h, number, signed, stateOf, table, trialLink } from "./dom.js";

export async function showCompare(app, params) {
  let runs;
  try {
    ({ runs } = await api("/api/runs"));
  } catch (error) {
    clear(app, failure(error));
    return;
  }
  const result = h("div", { id: "comparison" });
  const byRun = params.has("run");
  const options = (selected) => runs.map((r) => h("option", { value: r.id, selected: r.id === selected }, `${r.name} · ${r.id}`));
  const older = runs[1] ? runs[1].id : runs[0]?.id;
  const before = h("select", { name: "before" }, options(params.get("before") || older));
  const after = h("select", { name: "after" }, options(params.get("after") || runs[0]?.id));
  const one = h("select", { name: "run" }, options(params.get("run") || runs[0]?.id));
  const harnessA = h("select", { name: "a" });
  const harnessB = h("select", { name: "b" });
  const fillHarnesses = () => {
    const run = runs.find((r) => r.id === one.value);
    const names = run ? run.harnesses : [];
    clear(harnessA, names.map((n) => h("option", { value: n, selected: n === (params.get("a") || names[0]) }, n)));
    clear(harnessB, names.map((n) => h("option", { value: n, selected: n === (params.get("b") || names[1] || names[0]) }, n)));
  };
  one.addEventListener("change", fillHarnesses);
  fillHarnesses();
  const go = (query) => { location.search = new URLSearchParams(query).toString(); };
  clear(app,
    h("h1", {}, "Compare"),
    h("form", { class: "filters", onsubmit: (e) => { e.preventDefault(); go({ before: before.value, after: after.value }); } },
      h("b", {}, "A harness in two runs:"), h("label", {}, "before", before), h("label", {}, "after", after),
      h("button", { type: "submit" }, "compare runs")),
    h("form", { class: "filters", onsubmit: (e) => { e.preventDefault(); go({ run: one.value, a: harnessA.value, b: harnessB.value }); } },
      h("b", {}, "Two harnesses of one run:"), h("label", {}, "run", one), h("label", {}, "a", harnessA), h("label", {}, "b", harnessB),
      h("button", { type: "submit" }, "compare harnesses")),
    result);
  if (!runs.length) {
    clear(result, h("p", { class: "muted" }, "No runs in this store yet."));
    return;
  }
  if (byRun && params.get("a") && params.get("b")) {
    await show(result, `/api/compare/harnesses?${new URLSearchParams({ run: params.get("run"), a: params.get("a"), b: params.get("b") })}`,
      (data) => drawHarnesses(result, data));
  } else if (params.get("before") && params.get("after")) {
    const query = { before: params.get("before"), after: params.get("after") };
    if (params.get("harness")) query.harness = params.get("harness");
    await show(result, `/api/compare/runs?${new URLSearchParams(query)}`, (data) => drawRuns(result, data, query));
  }
}

async function show(box, path, draw) {
  clear(box, h("p", { class: "muted" }, "Comparing…"));
  try {
    draw(await api(path));
  } catch (error) {
    clear(box, failure(error));
  }
}

function drawHarnesses(box, data) {
  clear(box,
    h("h2", {}, `${data.b} against ${data.a} in ${data.run.name} (${data.run.id})`),
    data.datasets.length ? data.datasets.map((d) => dataset(d, data.a, data.b)) : h("p", { class: "muted" }, "No dataset has trials of both."));
}

function drawRuns(box, data, query) {
  const pick = h("select", { name: "harness", onchange: (e) => {
    location.search = new URLSearchParams({ ...query, harness: e.target.value }).toString();
  } }, data.harnesses.map((n) => h("option", { value: n, selected: n === data.harness }, n)));
  const summary = data.comparison
    ? data.comparison.datasets.map((d) => [
      h("h3", {}, d.name),
      table(["harness", "before", "after", "change [95% CI]", "p", "tasks", ""], d.harnesses.map((c) => [
        c.harness, estimate(c.before), estimate(c.after),
        `${signed(c.change.diff)} [${signed(c.change.low)}, ${signed(c.change.high)}]`, number(c.change.p_value),
        String(c.change.n_tasks), c.is_regression ? h("td", { class: "error" }, "REGRESSION") : ""])),
      d.flags.length ? h("ul", { class: "flags" }, d.flags.map((f) => h("li", {}, (f.harness ? `${f.harness}: ` : "") + f.message))) : null,
    ])
    : h("p", { class: "notice" }, data.comparison_error);
  clear(box,
    h("h2", {}, `${data.after.name} (${data.after.id}) against ${data.before.name} (${data.before.id})`),
    summary,
    data.harness ? [
      h("h2", {}, "Per task"),
      h("div", { class: "toolbar" }, h("label", {}, "harness", pick)),
      data.datasets.map((d) => dataset(d, `before (${data.before.id})`, `after (${data.after.id})`)),
    ] : h("p", { class: "muted" }, "The runs share no harness."));
}

function dataset(d, nameA, nameB) {
  const change = d.change;
  return [
    h("h3", {}, d.dataset),
    table(["", "mean reward [95% CI]"], [[nameA, estimate(d.a)], [nameB, estimate(d.b)]]),
    change
      ? h("p", { class: "pair" }, `b − a: ${signed(change.diff)} [${signed(change.low)}, ${signed(change.high)}], p = ${number(change.p_value)}, on ${change.n_tasks} shared tasks`,
        change.only_a || change.only_b ? ` (${change.only_a} scored only by ${nameB}, ${change.only_b} only by ${nameA})` : "")
      : h("p", { class: "notice" }, "No task is scored on both sides yet: nothing to pair."),
    table(["task", nameA, "mean", nameB, "mean", "b − a"], d.tasks.map((row) => [
      h("td", { class: "task" }, row.task), h("td", { class: "left" }, row.a.map(cell)), number(row.a_mean),
      h("td", { class: "left" }, row.b.map(cell)), number(row.b_mean), signed(row.diff)]), { class: "grid side-by-side" }),
  ];
}

function cell(trial) {
  const state = stateOf(trial);
  return h("a", { class: `cell o-${state}`, href: trialLink(trial.id), title: `attempt ${trial.attempt}: ${state}` }, String(trial.attempt));
}

